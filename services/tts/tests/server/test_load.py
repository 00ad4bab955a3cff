"""Admission control, cancelled and vanished clients, and slot/memory leaks."""

from __future__ import annotations

import asyncio
import time

import grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import config
from .test_streaming import audio, drain, text


async def wait_for(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


async def test_client_vanishing_mid_stream_frees_its_slot(server) -> None:
    cfg = config()
    cfg.sampling.max_frames = 200
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text("A long utterance that the client abandons. " * 4))
        await call.done_writing()
        while (await call.read()).WhichOneof("response") != "audio":
            pass
        assert server.metric("tts_active_sessions") >= 1
        call.cancel()
    assert await wait_for(lambda: server.metric("tts_active_sessions") == 0)


async def test_500_sessions_opened_and_cancelled_leak_nothing(server) -> None:
    async def open_and_cancel(ch: grpc.aio.Channel, i: int) -> None:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=config(seed=i)))
        await call.write(text("cancel me"))
        await call.read()  # SESSION_STARTED: the engine slot is taken
        call.cancel()

    rss0 = None
    async with grpc.aio.insecure_channel(server.addr) as ch:
        for batch in range(10):
            await asyncio.gather(*(open_and_cancel(ch, batch * 50 + i) for i in range(50)))
            if batch == 1:  # after warm-up allocations
                assert await wait_for(lambda: server.metric("tts_active_sessions") == 0)
                rss0 = server.rss_mb()
    assert await wait_for(lambda: server.metric("tts_active_sessions") == 0)
    grown = server.rss_mb() - rss0
    assert grown < 60, f"RSS grew {grown:.0f} MB over 400 cancelled sessions"
    # Still serving normally.
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=config()))
        await call.write(text("still here"))
        await call.done_writing()
        assert audio(await drain(call))


async def test_over_capacity_calls_are_rejected_and_admitted_ones_finish(make_server) -> None:
    srv = make_server(TTS_MAX_SESSIONS="10")
    cfg = config()
    cfg.sampling.max_frames = 10

    async def session(ch: grpc.aio.Channel, hold: asyncio.Event) -> str:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        try:
            await call.write(tts_pb2.SynthesizeRequest(config=cfg))
            first = await call.read()
            if first is grpc.aio.EOF:
                return (await call.code()).name
            await hold.wait()  # keep every admitted slot busy until all 11 have tried
            await call.write(text("load test"))
            await call.done_writing()
            frames = audio(await drain(call))
            return "OK" if frames else "EMPTY"
        except grpc.aio.AioRpcError as e:
            return e.code().name

    hold = asyncio.Event()
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        tasks = [asyncio.create_task(session(ch, hold)) for _ in range(11)]
        await wait_for(lambda: sum(t.done() for t in tasks) >= 1, 30)
        hold.set()
        results = await asyncio.gather(*tasks)
    assert sorted(results) == ["OK"] * 10 + ["RESOURCE_EXHAUSTED"], results


async def test_slow_reader_pauses_its_session_and_loses_nothing(make_server) -> None:
    srv = make_server(TTS_MAX_BACKLOG_S="0.3")
    cfg = config()
    cfg.sampling.max_frames = 40  # 3.2 s of audio, ten times the allowed backlog
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text("A reader that does not keep up. " * 3))
        await call.done_writing()
        await asyncio.sleep(3.0)  # read nothing for a while
        frames = audio(await drain(call))
    assert srv.metric("tts_flow_control_pauses_total") >= 1
    assert len(frames) == 40 * 4 and [f.seq for f in frames] == list(range(160))
