"""OpenAI-compatible speech over HTTP, on the service's HTTP port:

- `POST /v1/audio/speech`: OpenAI's request (`json_schema.SpeechRequest`), answered with
  the audio as it is made: `response_format` pcm (s16le mono) or wav, `stream_format`
  audio (the bytes, chunked) or sse (`speech.audio.delta` events, base64, then
  `speech.audio.done` with usage); `"stream": false` sends it whole, with its length.
- `GET /v1/models`, `GET /v1/audio/voices`: what `model` and `voice` may name.

A request is one synthesis call (`Synthesis.call`, protocol "http"): the same
admission, engine session, metrics and error rules as a gRPC stream that sends its text
and half-closes. Unpaced (a download, not a live stream): audio leaves as fast as the
client reads; a slow reader pauses its engine session (flow control). The call runs in
its own task; whatever it has made when the writer looks goes out in one write (a
packet's frames are made together: a write per packet, the first one at once, so time to
first byte is the gRPC path's). Errors are OpenAI's body (`{"error": {message, type, param, code}}`)
with the status `errors.STATUS` gives the call's error kind; the headers wait
for the first audio, so a call that fails before it gets its status. One that fails
after has sent 200: an sse stream ends with an `error` event, an audio stream is cut off
(no final chunk: the client sees a truncated body, never a short "complete" file).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from voice_tts.engine import Engine
from voice_tts.engine.engine_set import EngineSet
from voice_tts.server.call.messages import (
    AudioFrame,
    FirstAudio,
    Output,
    Reference,
    Request,
    SessionStarted,
    Text,
)
from voice_tts.server.call.protocol import MAX_FRAMES_PER_MESSAGE, RETRY_AFTER_S
from voice_tts.server.call.synthesis import Synthesis
from voice_tts.server.errors import CallError
from voice_tts.server.fronts.json_schema import (
    UNSUPPORTED_FORMATS,
    SpeechRequest,
    load_json,
    session_config,
    validation_message,
)
from voice_tts.server.voices.reference_audio import ReferenceAudio

log = logging.getLogger("voice_tts.http")
# Other names a client may send as `model`: OpenAI's speech models (code written for
# OpenAI runs unchanged). All of them are the one model this server loaded.
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# Responses made but not yet written: past this the call waits (and past
# TTS_MAX_BACKLOG_S of unwritten audio its engine session pauses).
READY_MAX = 64
FRAME_MS = 20
MAX_BODY_BYTES = 1 << 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = \
            status, message, param, code, kind

    @classmethod
    def of(cls, e: CallError) -> ApiError:
        s = e.status
        return cls(s.http, e.message, code=s.grpc.name.lower(), kind=s.openai)

    def response(self) -> web.Response:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else None
        return web.json_response(
            {"error": {"message": self.message, "type": self.kind, "param": self.param,
                       "code": self.code}}, status=self.status, headers=headers)


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte PCM s16le mono WAV header. `data_bytes` None: a stream of unknown length
    (sizes 0xFFFFFFFF, as streaming encoders write them; readers take the data to EOF)."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


class SpeechAPI:
    def __init__(self, calls: Synthesis) -> None:
        self.calls = calls
        engine = calls.engine
        self.model_ids = (engine.model_name, *MODEL_ALIASES)
        self.max_chars = calls.settings.max_text_chars

    def add_routes(self, app: web.Application, voices: bool = True) -> None:
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/v1/models", self.models)
        if voices:  # else the voice library's API (voices_http.py) serves it
            app.router.add_get("/v1/audio/voices", self.voices)

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "voice-stack"}
            for m in self.model_ids]})

    async def voices(self, _: web.Request) -> web.Response:
        engine = self.calls.engine
        return web.json_response({
            "voices": [{"name": v.name, "languages": list(v.languages),
                        "dialect": v.dialect or None} for v in engine.voices()],
            "languages": list(engine.languages()),
        })

    async def speech(self, request: web.Request) -> web.StreamResponse:
        try:
            req = await self._parse(request)
        except ApiError as e:
            return e.response()
        reference = None
        if req.ref_audio is not None:
            try:
                reference = Reference(ReferenceAudio(_base64_audio(req.ref_audio)),
                                      req.ref_text, req.x_vector_only_mode)
            except ApiError as e:
                return e.response()
        # Written a packet at a time: its frames come as one message, not 4-16 to join.
        cfg = session_config(req, FRAME_MS, trace_id=request.headers.get("X-Trace-Id", ""),
                             frames_per_message=MAX_FRAMES_PER_MESSAGE, reference=reference)

        async def requests() -> AsyncIterator[Request]:
            yield cfg
            yield Text(req.input)

        out = _Body(request, req, self.calls.engine)
        ready: asyncio.Queue[Any] = asyncio.Queue(READY_MAX)

        async def call() -> None:  # its own task: the one a drain or engine fault cuts
            try:
                async with self.calls.call("http", requests(), pace_lead_s=0.0) as c:
                    async for resp in c:
                        await ready.put(resp)
                await ready.put(None)
            except CallError as e:
                await ready.put(e)

        producer = asyncio.create_task(call())
        try:
            while True:
                # Everything the call made since the last write goes out in one: a
                # packet's frames are made together, so a write per packet.
                items = [await ready.get()]
                while not ready.empty():
                    items.append(ready.get_nowait())
                for item in items:
                    if item is None or isinstance(item, CallError):
                        break
                    out.take(item)
                await out.send()
                if item is None:
                    return await out.finish()
                if isinstance(item, CallError):
                    if not out.started:
                        return ApiError.of(item).response()
                    return await out.fail(item)
        finally:
            producer.cancel()  # the client went away (or we failed): the call ends
            with contextlib.suppress(asyncio.CancelledError):
                await producer

    async def _parse(self, request: web.Request) -> SpeechRequest:
        # JSON only: a form or text/plain POST is what a web page may send cross-origin
        # without asking first (no CORS preflight); this one cannot be.
        if request.content_type != "application/json":
            raise ApiError(415, f"Content-Type must be application/json, not "
                           f"{request.content_type[:60]!r}", code="unsupported_media_type")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes",
                           code="request_too_large")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes",
                           code="request_too_large") from None
        try:
            obj = load_json(body)
        except ValueError as e:
            raise ApiError(400, f"the body must be JSON: {e}", code="invalid_json") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        try:
            req = SpeechRequest.model_validate(obj)
        except ValidationError as e:
            param, message = validation_message(e)
            raise ApiError(400, message, param=param, code="invalid_value") from None
        if req.model is not None and req.model not in self.model_ids:
            raise ApiError(404, f"unknown model {req.model[:64]!r}; this server has "
                           f"{list(self.model_ids)} (one model)", param="model",
                           code="model_not_found")
        fmt = req.response_format
        if fmt in UNSUPPORTED_FORMATS:
            raise ApiError(400, f"response_format {fmt!r} is not supported: only pcm (s16le "
                           "mono) and wav, which need no encoder and add no delay; encode "
                           "on the client", param="response_format", code="unsupported_format")
        if fmt not in ("pcm", "wav"):
            raise ApiError(400, f"unknown response_format {fmt[:32]!r}; use pcm or wav",
                           param="response_format", code="invalid_value")
        if req.speed != 1.0:
            raise ApiError(400, f"speed {req.speed} is not supported, only 1.0: the model "
                           "has no rate control, and time-stretching would add delay and "
                           "artifacts", param="speed", code="unsupported_value")
        if not req.input.strip():
            raise ApiError(400, "input is empty", param="input", code="invalid_value")
        if len(req.input) > self.max_chars:
            raise ApiError(413, f"input is {len(req.input)} characters; the limit is "
                           f"{self.max_chars} (TTS_MAX_TEXT_CHARS)", param="input",
                           code="input_too_long")
        if not req.stream and req.stream_format == "sse":
            raise ApiError(400, 'stream_format "sse" streams; it cannot be "stream": false',
                           param="stream", code="invalid_value")
        return req


def _base64_audio(value: str) -> bytes:
    """`ref_audio`: base64, or a data URL of it; a URL to fetch is refused (the server
    reaches no address a request names)."""
    head, sep, data = value.partition(",")
    if sep and head.startswith("data:") and head.endswith(";base64"):
        value = data
    elif value.split(":", 1)[0].lower() in ("http", "https", "file", "ftp"):
        raise ApiError(400, "ref_audio is a URL; this server fetches none: send the WAV as "
                       "base64 or a data:audio/wav;base64, URL", param="ref_audio",
                       code="invalid_value")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, "ref_audio is not base64 (a WAV file, base64-encoded)",
                       param="ref_audio", code="invalid_value") from None


class _Body:
    """The response of one speech request, fed the call's output in order."""

    def __init__(self, request: web.Request, req: SpeechRequest,
                 engine: Engine | EngineSet) -> None:
        self.request, self.req, self.engine = request, req, engine
        self.resp: web.StreamResponse | None = None
        self.rate = req.sample_rate
        self.buf = bytearray()
        self.whole = bytearray()  # "stream": false
        self.samples = 0
        self.timings: dict[str, float] = {}
        self.session_id = ""

    @property
    def started(self) -> bool:
        return self.resp is not None

    def take(self, r: Output) -> None:
        if isinstance(r, AudioFrame):
            self.samples += len(r.pcm) // 2
            (self.buf if self.req.stream else self.whole).extend(r.pcm)
        elif isinstance(r, SessionStarted):
            self.session_id = r.config.session_id
        elif isinstance(r, FirstAudio):
            t = r.timings
            self.timings = {"ttfa": t.ttfa_ms, "prefill": t.prefill_ms, "queue": t.queue_ms}

    async def send(self) -> None:
        """Writes the audio taken so far (the headers first, with the first audio)."""
        if not self.buf or not self.req.stream:
            return
        if self.resp is None:
            await self._start()
        await self._send()

    async def _start(self) -> None:
        sse = self.req.stream_format == "sse"
        ctype = "text/event-stream" if sse else f"audio/{self.req.response_format}"
        headers = {"Content-Type": ctype, "X-Session-Id": self.session_id,
                   "X-Sample-Rate": str(self.rate), "Cache-Control": "no-cache"}
        headers.update({f"X-TTS-{k.capitalize()}-Ms": f"{v:.1f}"
                        for k, v in self.timings.items()})
        self.resp = web.StreamResponse(headers=headers)
        self.resp.enable_chunked_encoding()
        await self.resp.prepare(self.request)
        if self.req.response_format == "wav":
            self.buf[:0] = wav_header(self.rate, None)

    async def _send(self) -> None:
        assert self.resp is not None
        data, self.buf = bytes(self.buf), bytearray()
        if self.req.stream_format == "sse":
            await self._event({"type": "speech.audio.delta",
                               "audio": base64.b64encode(data).decode()})
        else:
            await self.resp.write(data)

    async def _event(self, obj: dict) -> None:
        assert self.resp is not None
        await self.resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    async def fail(self, e: CallError) -> web.StreamResponse:
        """The call failed after the headers went out: sse ends with an `error` event,
        audio is cut off."""
        log.warning("speech request failed mid-stream (%s): %s", e.status.grpc.name,
                    e.message)
        if self.req.stream_format != "sse":
            raise Truncate(e.message)
        await self._event({"type": "error", "error": {
            "message": e.message, "type": e.status.openai,
            "code": e.status.grpc.name.lower()}})
        assert self.resp is not None
        await self.resp.write_eof()
        return self.resp

    async def finish(self) -> web.StreamResponse:
        if not self.req.stream:
            fmt = self.req.response_format
            body = (wav_header(self.rate, len(self.whole)) if fmt == "wav" else b"") \
                + self.whole
            return web.Response(body=body, content_type=f"audio/{fmt}", headers={
                "X-Session-Id": self.session_id, "X-Sample-Rate": str(self.rate)})
        if self.resp is None:  # no audio at all (the model ended at once)
            await self._start()
            if self.buf:
                await self._send()
        if self.req.stream_format == "sse":
            codec_s = self.engine.frame_samples / self.engine.sample_rate  # 80 ms
            frames = round(self.samples / (self.rate * codec_s))  # codec frames
            tokens = len(self.engine.tokenizer.encode(self.req.input))
            await self._event({"type": "speech.audio.done", "usage": {
                "input_tokens": tokens, "output_tokens": frames,
                "total_tokens": tokens + frames}})
        assert self.resp is not None
        await self.resp.write_eof()
        return self.resp


class Truncate(Exception):
    """Raised out of the handler after its headers: aiohttp then closes the connection
    without the final chunk, so the client cannot take the body for complete."""
