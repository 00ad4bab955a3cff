"""Engine faults on a real server: a fault that poisons the device fails the server fast
(NOT_SERVING, UNAVAILABLE for every call, exit status 3 for the orchestrator), one that
does not ends only the calls whose step failed, and a hung engine is failed by time.

Faults are injected into the decode step's launch by the engine's test hook (the
server's TTS_TEST_FAULT, `EngineSettings.fault` in-process: engine/faults.py): a CUDA
error text exactly as torch raises it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from urllib.error import HTTPError

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_testkit import free_port
from voice_tts.engine import Engine, EngineSettings
from voice_tts.server.server import EXIT_ENGINE_FAULT, start_server
from voice_tts.settings import TTSSettings

from .conftest import config
from .test_streaming import FLUSH, audio, drain, one_shot, text

LONG = "A sentence long enough to take more than a few engine steps to speak out loud."


async def _start_call(stub, max_frames: int = 40):
    cfg = config()
    cfg.sampling.max_frames = max_frames
    call = stub.Synthesize()
    await call.write(tts_pb2.SynthesizeRequest(config=cfg))
    await call.write(text(LONG))
    await call.write(FLUSH)
    return call


async def _status(call) -> tuple[grpc.StatusCode, str]:
    try:
        await drain(call)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status
    except HTTPError as e:
        return e.code


def _wait_exit(srv, timeout: float) -> int | None:
    try:
        return srv.proc.wait(timeout)
    except Exception:
        return None


async def test_a_cuda_fault_ends_every_call_unavailable_and_exits_fast(make_server) -> None:
    srv = make_server(TTS_TEST_FAULT="cuda@3")
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        calls = [await _start_call(stub) for _ in range(2)]
        statuses = await asyncio.gather(*(_status(c) for c in calls))
        ended = time.monotonic()
    for code, details in statuses:
        assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
        assert "restarting" in details and "CUDA error" in details
    rc = _wait_exit(srv, 10)
    assert rc == EXIT_ENGINE_FAULT, srv.log_path.read_text()[-2000:]
    assert time.monotonic() - ended < 5, "the process must exit within a few seconds"
    assert "fatal engine fault" in srv.log_path.read_text()


async def test_a_fault_that_spares_the_device_ends_only_its_calls(make_server) -> None:
    srv = make_server(TTS_TEST_FAULT="bug@3")
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        code, details = await _status(await _start_call(stub))
        assert code == grpc.StatusCode.INTERNAL and "synthesis failed" in details, details
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    # The next call is served in full.
    frames = audio(await one_shot(srv.addr, config(), ["The next call works."]))
    assert frames and frames[-1].last_in_utterance
    assert srv.proc.poll() is None


async def test_a_hung_engine_is_failed_by_the_watchdog(make_server) -> None:
    srv = make_server(TTS_TEST_FAULT="hang@3", TTS_ENGINE_STALL_S="1")
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        code, details = await _status(await _start_call(tts_pb2_grpc.TextToSpeechStub(ch)))
    assert code == grpc.StatusCode.UNAVAILABLE and "stalled" in details, details
    assert _wait_exit(srv, 10) == EXIT_ENGINE_FAULT


@pytest.fixture
async def faulted_server():
    """An in-process server whose engine hits a CUDA error at its 3rd step launch."""
    engine = Engine.from_preset("tiny", settings=EngineSettings(max_sessions=4, max_batch=4,
                                                                fault="cuda@3"))
    settings = TTSSettings(grpc_host="127.0.0.1", grpc_port=free_port(),
                           http_port=free_port(), admit_margin=0)
    running = await start_server(settings, engine)
    yield running, settings
    await running.server.stop(0)
    if running.http_runner is not None:
        await running.http_runner.cleanup()
    engine.shutdown()


async def test_health_turns_not_serving_at_once_and_new_calls_are_refused(
        faulted_server) -> None:
    running, settings = faulted_server
    addr = f"127.0.0.1:{running.grpc_port}"
    assert await asyncio.to_thread(_healthz, settings.http_port) == 200
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        code, details = await _status(await _start_call(stub))
        assert code == grpc.StatusCode.UNAVAILABLE and "restarting" in details
        assert running.failed.is_set()
        health = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="voice.tts.v1.TextToSpeech"))
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await asyncio.to_thread(_healthz, settings.http_port) == 503
        call = stub.Synthesize()  # refused before its config is read: only await the end
        assert await call.code() == grpc.StatusCode.UNAVAILABLE
        assert "restarting" in await call.details()
