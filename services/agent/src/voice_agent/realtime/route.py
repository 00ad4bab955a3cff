"""The `/v1/realtime` route: the same door as `/v1/talk` (conversation/door.py: origin,
API key, open sockets, the shared conversation slots, load), then one RealtimeSession per
socket until the client goes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import WSMsgType, web

from ..conversation.door import REFUSED, Refused
from ..talk.hub import TalkHub
from ..voices import VoicesUnavailable, find, list_voices, not_found_message
from .events import RealtimeError, error_event
from .session import RealtimeSession

log = logging.getLogger("voice_agent.realtime")

PATH = "/v1/realtime"
# A 20 MB append must reach the session to be answered with an error event (the API's
# limit is 15 MiB of base64 an event); bigger messages are cut by aiohttp (close 1009).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def _refusal(e: Refused) -> dict[str, object]:
    """The door's refusal as the API's error event (its codes: invalid_api_key, ...)."""
    code = {"unauthorized": "invalid_api_key", "busy": "rate_limit_exceeded"}.get(e.code, e.code)
    return error_event(RealtimeError(code, e.message,
                                     type_="server_error" if e.code == "busy" else
                                     "invalid_request_error"))


async def handle(hub: TalkHub, request: web.Request) -> web.StreamResponse:
    door = hub.door
    try:
        door.check(request, PATH)
    except Refused as e:  # before the upgrade: no socket, no slot
        REFUSED.labels(reason=e.reason).inc()
        return web.json_response(_refusal(e), status=e.status, headers=(
            {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}))
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_MESSAGE_BYTES)
    await ws.prepare(request)
    try:
        with door.opened(ws):
            release = door.take_slot()
            await _converse(hub, ws, request, release)
    except Refused as e:
        REFUSED.labels(reason=e.reason).inc()
        with contextlib.suppress(Exception):
            await ws.send_json(_refusal(e))
            await ws.close(code=e.close_code, message=e.code.encode())
    return ws


async def _converse(hub: TalkHub, ws: web.WebSocketResponse, request: web.Request,
                    release: Callable[[], None]) -> None:
    """One RealtimeSession on the socket until the client goes; its slot is `release`d."""
    settings = hub.settings
    beta = "realtime=v1" in request.headers.get("OpenAI-Beta", "")

    async def check_voice(name: str) -> str:
        try:
            voices = await list_voices(settings)
        except VoicesUnavailable as e:
            log.warning("realtime: voice %r not checked: %s", name, e)
            return name
        voice = find(voices, name)
        if voice is None:
            raise RealtimeError("invalid_value", not_found_message(name, voices,
                                                                   settings.tts_addr),
                                "session.voice")
        return voice.name

    session = RealtimeSession(settings, ws.send_str, beta, check_voice)
    t0 = time.perf_counter()
    log.info("realtime %s: start (%s events), from %s", session.id, "beta" if beta else "GA",
             request.remote)
    sender = asyncio.create_task(session.outbox.run(), name=f"rt-{session.id}-send")
    receiver = asyncio.create_task(_receive(session, ws), name=f"rt-{session.id}-recv")
    try:
        session.start()
        # either side ending ends the session: the client going, or its outbox stalled
        # (it stopped reading: conversation/outbox.py)
        await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
        if receiver.done() and not receiver.cancelled() and receiver.exception():
            log.error("realtime %s failed", session.id, exc_info=receiver.exception())
    finally:
        # The slot first: the teardown below awaits a client that may have stopped reading
        # or reset, and a close that raised (CancelledError is no Exception) once skipped
        # the release and kept the slot until a restart.
        release()
        receiver.cancel()
        try:
            # shielded: a handler cancelled here (the client reset) still stops the
            # session's thinker and TTS work
            await asyncio.shield(session.close())
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(sender, 2.0)  # what was queued goes out, if it can
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(ws.close(), 2.0)
            log.info("realtime %s: end after %.1f s", session.id, time.perf_counter() - t0)


async def _receive(session: RealtimeSession, ws: web.WebSocketResponse) -> None:
    """The client's events, one at a time, until it goes."""
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await session.handle(msg.data)
        elif msg.type == WSMsgType.BINARY:
            session.error(RealtimeError(
                "invalid_event", "binary messages are not part of the Realtime API: send "
                "audio as input_audio_buffer.append (base64)"))
        elif msg.type == WSMsgType.ERROR:
            return
