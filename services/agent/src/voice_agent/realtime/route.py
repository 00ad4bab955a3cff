"""The `/v1/realtime` route: the same door as `/v1/talk` (origin, API key, the hub's
conversation slots), then one RealtimeSession per socket until the client goes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import WSMsgType, web
from voice_keys import bearer

from ..talk.hub import REFUSED, TalkHub
from ..talk.protocol import Close, ProtocolError
from ..voices import VoicesUnavailable, find, list_voices, not_found_message
from .events import RealtimeError, error_event
from .session import RealtimeSession

log = logging.getLogger("voice_agent.realtime")

PATH = "/v1/realtime"
# A 20 MB append must reach the session to be answered with an error event (the API's
# limit is 15 MiB of base64 an event); bigger messages are cut by aiohttp (close 1009).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def _refusal(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response(error_event(RealtimeError(code, message)), status=status,
                             headers=headers)


async def handle(hub: TalkHub, request: web.Request) -> web.StreamResponse:
    if not hub.origin_allowed(request):
        REFUSED.labels(reason="origin").inc()
        return _refusal(403, "origin_not_allowed", f"origin {request.headers['Origin'][:100]!r}"
                        " may not open /v1/realtime (the agent's own host, or AGENT_WS_ORIGINS)")
    key = bearer(request.headers.get("Authorization")) or request.query.get("api_key")
    if not hub.keys.allows(key):
        REFUSED.labels(reason="unauthorized").inc()
        return _refusal(401, "invalid_api_key", hub.keys.refusal(key),
                        **{"WWW-Authenticate": "Bearer"})
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_MESSAGE_BYTES)
    await ws.prepare(request)
    try:
        if len(hub.sockets) >= hub.max_open:
            raise ProtocolError("busy", f"too many connections ({hub.max_open}) are open; "
                                "try again later", Close.TRY_AGAIN_LATER)
        release = hub.take_slot()
    except ProtocolError as e:
        REFUSED.labels(reason=e.reason).inc()
        with contextlib.suppress(Exception):
            await ws.send_json(error_event(RealtimeError(
                "rate_limit_exceeded" if e.code == "busy" else e.code, e.message,
                type_="server_error")))
            await ws.close(code=e.close_code, message=e.code.encode())
        return ws
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
    hub.sockets.add(ws)
    t0 = time.perf_counter()
    log.info("realtime %s: start (%s events), from %s", session.id, "beta" if beta else "GA",
             request.remote)
    sender = asyncio.create_task(session.sender(), name=f"rt-{session.id}-send")
    try:
        session.start()
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await session.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                session.error(RealtimeError(
                    "invalid_event", "binary messages are not part of the Realtime API: send "
                    "audio as input_audio_buffer.append (base64)"))
            elif msg.type == WSMsgType.ERROR:
                break
            if session.stalled or sender.done():
                break
    except Exception:
        log.exception("realtime %s failed", session.id)
    finally:
        # The slot and the socket's place first: the teardown below awaits a client that
        # may have stopped reading or reset, and a close that raised (CancelledError is
        # no Exception) once skipped them and kept the slot until a restart.
        release()
        hub.sockets.discard(ws)
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
    return ws
