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

from ..conversation.door import Refused, converse
from ..talk.hub import TalkHub
from ..voices import UnknownVoice, resolve
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
    return await hub.door.upgrade(
        request, PATH, MAX_MESSAGE_BYTES, _refusal,
        lambda ws: _converse(hub, ws, request, hub.door.take_slot()))


async def _converse(hub: TalkHub, ws: web.WebSocketResponse, request: web.Request,
                    release: Callable[[], None]) -> None:
    """One RealtimeSession on the socket until the client goes; its slot is `release`d."""
    settings = hub.settings
    beta = "realtime=v1" in request.headers.get("OpenAI-Beta", "")

    async def check_voice(name: str) -> str:
        try:
            return await resolve(settings, name, "realtime")
        except UnknownVoice as e:
            raise RealtimeError("invalid_value", str(e), "session.voice") from None

    session = RealtimeSession(settings, ws.send_str, beta, check_voice)
    t0 = time.perf_counter()
    log.info("realtime %s: start (%s events), from %s", session.id, "beta" if beta else "GA",
             request.remote)

    async def start() -> None:
        session.start()

    try:
        receiver = await converse(session.outbox, _receive(session, ws), start, session.close,
                                  release, f"rt-{session.id}")
        if not receiver.cancelled() and receiver.exception():
            log.error("realtime %s failed", session.id, exc_info=receiver.exception())
    finally:
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
