"""Streams text pieces into `Synthesize` and collects frames, with client-side timings.

TTFA here is client side: the first text piece written -> the first AudioFrame read
(server TTFA + network). RTF: the first piece -> the last frame, over the audio length:
delivery, which a paced server (TTS_PACE_LEAD_S) holds near real time after its lead;
the server's synthesis speed is its `tts_rtf` metric.

The writer stops the moment the call ends: gRPC asyncio reports a write that races the
server ending the call as INTERNAL, over the server's status (grpc/grpc#36066); the
reader raises the server's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc


@dataclass
class SynthesisResult:
    pcm: bytes = b""
    sample_rate: int = 24000
    frames: int = 0
    ttfa_s: float | None = None
    wall_s: float = 0.0
    events: list[tts_pb2.Event] = field(default_factory=list)
    frame_times: list[float] = field(default_factory=list)  # arrival, seconds from start

    @property
    def audio_s(self) -> float:
        return len(self.pcm) / 2 / self.sample_rate

    @property
    def rtf(self) -> float:
        return self.wall_s / self.audio_s if self.audio_s else float("inf")

    @property
    def server_ttfa_ms(self) -> float | None:
        first = [e for e in self.events if e.type == tts_pb2.Event.FIRST_AUDIO]
        return first[0].timings.ttfa_ms if first else None


async def synthesize(
    channel: grpc.aio.Channel,
    pieces: Iterable[str] | AsyncIterator[str],
    config: tts_pb2.SessionConfig,
    interval_s: float = 0.0,
    api_key: str = "",
) -> SynthesisResult:
    """Sends `pieces` (with `interval_s` between them, like an LLM), then half-closes.
    A call the server ends raises its status (`grpc.aio.AioRpcError`). `api_key`: for a
    server with TTS_API_KEYS."""
    stub = tts_pb2_grpc.TextToSpeechStub(channel)
    res = SynthesisResult(sample_rate=config.sample_rate or 24000)
    t0: list[float] = []
    call = stub.Synthesize(metadata=key_metadata(api_key))

    async def texts() -> AsyncIterator[str]:
        if isinstance(pieces, AsyncIterator):
            async for p in pieces:
                yield p
        else:
            for i, p in enumerate(pieces):
                if i and interval_s:
                    await asyncio.sleep(interval_s)
                yield p

    async def write() -> None:
        await call.write(tts_pb2.SynthesizeRequest(config=config))
        async for p in texts():
            if call.done():
                return
            t0 or t0.append(time.perf_counter())
            await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=p)))
        await call.done_writing()

    writer = asyncio.create_task(write())
    # Cancelled when the status arrives, before a write in flight can fail and overwrite
    # it (the callback runs as the status is set).
    call.add_done_callback(lambda _: writer.cancel())
    chunks: list[bytes] = []
    try:
        async for resp in call:
            now = time.perf_counter()
            if resp.WhichOneof("response") == "audio":
                if res.ttfa_s is None and t0:
                    res.ttfa_s = now - t0[0]
                chunks.append(resp.audio.pcm)
                res.frames += 1
                res.frame_times.append(now - t0[0] if t0 else 0.0)
            else:
                res.events.append(resp.event)
    finally:
        writer.cancel()
        # The reader's status is the call's: a failed write only stopped the writing.
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError,
                                 asyncio.InvalidStateError):
            await writer
        call.cancel()
    res.pcm = b"".join(chunks)
    res.wall_s = (time.perf_counter() - t0[0]) if t0 else 0.0
    return res


async def list_voices(channel: grpc.aio.Channel, api_key: str = ""
                      ) -> tts_pb2.ListVoicesResponse:
    return await tts_pb2_grpc.TextToSpeechStub(channel).ListVoices(
        tts_pb2.ListVoicesRequest(), metadata=key_metadata(api_key))


def key_metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that shows an API key (none: nothing sent)."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()
