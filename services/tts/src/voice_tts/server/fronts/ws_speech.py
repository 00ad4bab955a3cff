"""`GET /v1/audio/speech/stream`: live text in, PCM frames out, over one WebSocket.

One connection is one session: the gRPC `Synthesize` stream in WebSocket clothes
(`Synthesis.call`, protocol "websocket": the same admission, engine session,
pacing, flow control, metrics and error rules). The messages are in `json_schema.py`:
a `config` first (within TTS_CONFIG_TIMEOUT_S), then text appends (JSON `text`, or a
binary message of raw UTF-8 split anywhere), `flush`, `stop`, `reset`, `end`. Out go
binary PCM frames and JSON events (`started`, `first_audio` with timings, `flushed`,
`stopped`, `reset`, `truncated`).

How a session ends: `end` -> the last frames, `flushed`, close 1000. A failure -> an
`error` event (code, message), then the close code `errors.STATUS` gives its kind
(1008 bad input, 1013 at capacity, 1012 restarting or draining, 1011 internal), or 1009
from aiohttp for a message over `MAX_MESSAGE_BYTES`. A client that goes away (close,
vanished: heartbeat) ends its call at once: its engine slot is free within a step.
A slow reader: sends wait for the socket to drain, the unsent audio grows, and past
TTS_MAX_BACKLOG_S the engine pauses the session (as for gRPC).

Audio frames go out through `FrameBatch`: the binary frames one turn of the event loop
makes (a paced writer's wake writes ~10) are framed here and written to the socket in one
call. aiohttp's `send_bytes` made one send syscall a 20 ms frame, ~2/3 of the WebSocket's
cost to the engine's process (bench/results/2026-11-27-front-cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator

from aiohttp import WSCloseCode, WSMsgType, web

from voice_tts.server.call.messages import AudioFrame, Request
from voice_tts.server.call.synthesis import Synthesis
from voice_tts.server.errors import CallError, invalid
from voice_tts.server.fronts.json_schema import (
    WSConfig,
    parse_ws_message,
    session_config,
    ws_error,
    ws_event,
    ws_request,
)

log = logging.getLogger("voice_tts.ws")
# One message's size: text appends are small; the utterance's limit is TTS_MAX_TEXT_CHARS.
WS_PATH = "/v1/audio/speech/stream"
MAX_MESSAGE_BYTES = 64 * 1024
HEARTBEAT_S = 20.0  # pings: a peer that vanished without a close is found within ~2x this


# A sender waits while this much is unsent in the socket's buffer (aiohttp's own writer
# waits past its 64 KiB limit): a reader that stops reading stalls its call's writer.
SEND_BUFFER_BYTES = 64 * 1024
DRAIN_POLL_S = 0.01


class FrameBatch:
    """Binary WebSocket frames (RFC 6455: FIN, opcode 2, unmasked, no compression, as
    aiohttp's writer frames them for a server) gathered in one loop turn and written to
    the transport with one call at its end, or before anything else is sent (`flush`)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._frames: list[bytes] = []

    async def send(self, payload: bytes) -> None:
        if self.transport.is_closing():
            raise ConnectionResetError("the WebSocket's transport is closing")
        n = len(payload)
        header = (struct.pack("!BB", 0x82, n) if n < 126 else
                  struct.pack("!BBH", 0x82, 126, n) if n < 65536 else
                  struct.pack("!BBQ", 0x82, 127, n))
        if not self._frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self._frames += (header, payload)
        if self.transport.get_write_buffer_size() > SEND_BUFFER_BYTES:
            self.flush()
            while (self.transport.get_write_buffer_size() > SEND_BUFFER_BYTES
                   and not self.transport.is_closing()):
                await asyncio.sleep(DRAIN_POLL_S)

    def flush(self) -> None:
        if self._frames:
            if not self.transport.is_closing():
                self.transport.write(b"".join(self._frames))
            self._frames.clear()


class _WebSocket(web.WebSocketResponse):
    """aiohttp's WebSocketResponse whose heartbeat stays off once the socket closes.

    aiohttp (since aio-libs/aiohttp#12030; 3.14.5 here) re-arms the heartbeat a loop turn
    after data arrives, closed or not: the client's CLOSE frame, read by `close()`,
    re-arms it after `close()` cancelled it. That timer (20 s, then the 10 s pong wait)
    held each closed response, its request, transport and buffers ~30 s past its session:
    ~750 closed sessions alive at once at 500 sessions a 20 s round (README, "Memory")."""

    def _reset_heartbeat(self) -> None:
        if not (self._closed or self._closing):
            super()._reset_heartbeat()


class SpeechSocket:
    def __init__(self, calls: Synthesis) -> None:
        self.calls = calls

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(WS_PATH, self.handle)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        # aiohttp refuses a message of max_msg_size bytes itself (its bound is exclusive):
        # +1, so that MAX_MESSAGE_BYTES is the largest message taken, as documented.
        ws = _WebSocket(max_msg_size=MAX_MESSAGE_BYTES + 1,
                         heartbeat=HEARTBEAT_S, compress=False)
        await ws.prepare(request)
        gone = asyncio.Event()  # the client closed (or vanished) without `end`
        if request.transport is None:  # the client left during the handshake
            return ws
        frames = FrameBatch(request.transport)
        serve = asyncio.create_task(self._serve(ws, frames, self._requests(ws, gone)))
        left = asyncio.create_task(gone.wait())
        try:
            await asyncio.wait((serve, left), return_when=asyncio.FIRST_COMPLETED)
            if not serve.done():  # the client left: its call ends now
                serve.cancel()
                with contextlib.suppress(asyncio.CancelledError, CallError):
                    await serve
                log.info("websocket client went away; its call ended")
            else:
                serve.result()
                await ws.close(code=WSCloseCode.OK, message=b"done")
        except CallError as e:
            await self._fail(ws, e)
        finally:
            left.cancel()
            serve.cancel()
        return ws

    async def _serve(self, ws: web.WebSocketResponse, frames: FrameBatch,
                     requests: AsyncIterator[Request]) -> None:
        """The call, its responses out as frames and events (in its own task: the one a
        drain or an engine fault cuts)."""
        async with self.calls.call("websocket", requests) as responses:
            try:
                async for r in responses:
                    if type(r) is AudioFrame:
                        await frames.send(r.pcm)
                    else:
                        frames.flush()  # in order: the frames before it first
                        await ws.send_str(json.dumps(ws_event(r)))
            except ConnectionError:  # the socket closed under a send: the client left
                log.info("websocket client went away mid-call; its call ended")
            finally:
                frames.flush()  # before the error event or the close

    async def _requests(self, ws: web.WebSocketResponse, gone: asyncio.Event
                        ) -> AsyncIterator[Request]:
        """The client's messages as the call's requests: the config, then the rest."""
        first = True
        while True:
            msg = await ws.receive()
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                gone.set()  # not a half-close: nothing more will be read
                await asyncio.Future()  # the call is cancelled
            if msg.type == WSMsgType.ERROR:
                raise invalid(f"bad WebSocket message ({msg.data}); one message may hold "
                              f"{MAX_MESSAGE_BYTES} bytes")
            try:
                parsed = parse_ws_message(msg.data)
            except ValueError as e:
                raise invalid(str(e)) from None
            if first:
                if not isinstance(parsed, WSConfig):
                    kind = "binary text" if isinstance(parsed, bytes) else parsed.type
                    raise invalid(f'the first message must be {{"type": "config", ...}}, '
                                  f"got {kind}")
                first = False
                yield session_config(parsed, parsed.frame_ms, parsed.session_id,
                                     parsed.trace_id)
                continue
            if isinstance(parsed, WSConfig):
                raise invalid("a second config; send one per connection, first")
            req = ws_request(parsed)
            if req is None:  # `end`: a half-close (flush, then the call ends)
                return
            yield req

    async def _fail(self, ws: web.WebSocketResponse, e: CallError) -> None:
        code = e.status.grpc
        if e.kind != "invalid":
            log.info("websocket call ended: %s %s", code.name, e.message)
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not ws.closed:
                await ws.send_str(json.dumps(ws_error(code.name.lower(), e.message)))
                # A close reason holds at most 123 bytes; the event above has it all.
                await ws.close(code=e.status.ws,
                               message=e.message.encode()[:120])
