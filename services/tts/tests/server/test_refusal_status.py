"""A call the server turns away gets the status that tells the client what to do, every
time: RESOURCE_EXHAUSTED when it is full, UNAVAILABLE while it drains, INVALID_ARGUMENT
for a bad config, even when the client writes its whole request at once (config, text,
FLUSH, half-close), as most clients do.

A status sent while the client's writes are still in flight reaches a grpc.aio client as
INTERNAL "Internal error from Core" (grpc/grpc#36066: its failed write overwrites the
status): a client would not retry elsewhere. So the server reads what the client sends
until it half-closes (or goes quiet) before it answers."""

from __future__ import annotations

import asyncio
import signal

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import config
from .test_streaming import is_event, read_until, text

CALLS = 120  # at once, each writing its whole request as fast as it can


async def whole_request(stub: tts_pb2_grpc.TextToSpeechStub,
                        cfg: tts_pb2.SessionConfig | None = None) -> grpc.StatusCode:
    """The OpenAI-style client: config, text, FLUSH and half-close, back to back."""
    call = stub.Synthesize()
    try:
        await call.write(tts_pb2.SynthesizeRequest(config=cfg or config()))
        await call.write(text("Every word of this request is written before any reply. " * 4))
        await call.write(tts_pb2.SynthesizeRequest(
            control=tts_pb2.Control(type=tts_pb2.Control.FLUSH)))
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the status already came: it is read below
    return await call.code()


async def burst(stub, cfg=None) -> dict[str, int]:
    codes = await asyncio.gather(*(whole_request(stub, cfg) for _ in range(CALLS)))
    out: dict[str, int] = {}
    for c in codes:
        out[c.name] = out.get(c.name, 0) + 1
    return out


async def test_refusals_and_drains_race_the_clients_writes(make_server) -> None:
    srv = make_server(TTS_MAX_SESSIONS="1", TTS_DRAIN_TIMEOUT_S="30")
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        holder = stub.Synthesize()  # holds the one session: every other call is refused
        await holder.write(tts_pb2.SynthesizeRequest(config=config()))
        await read_until(holder, is_event(tts_pb2.Event.SESSION_STARTED))

        assert await burst(stub) == {"RESOURCE_EXHAUSTED": CALLS}
        bad = config()
        bad.voice = "nobody"
        assert await burst(stub, bad) == {"RESOURCE_EXHAUSTED": CALLS}  # full comes first

        srv.proc.send_signal(signal.SIGTERM)  # the holder keeps the drain open
        await asyncio.sleep(0.3)
        assert await burst(stub) == {"UNAVAILABLE": CALLS}
        await holder.done_writing()
    assert srv.proc.wait(30) == 0


async def test_a_bad_config_written_whole_gets_its_own_status(make_server) -> None:
    srv = make_server(TTS_MAX_SESSIONS=str(CALLS))  # every call gets as far as its config
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        bad = config()
        bad.voice = "nobody"
        assert await burst(stub, bad) == {"NOT_FOUND": CALLS}
        bad = config()
        bad.frame_ms = 7
        assert await burst(stub, bad) == {"INVALID_ARGUMENT": CALLS}
