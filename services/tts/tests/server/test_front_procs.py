"""gRPC front processes (`TTS_FRONT_PROCS`, fronts/front_link.py) on a real tiny server:
calls over several connections (spread over the fronts by SO_REUSEPORT) speak, refuse and
cancel exactly as without fronts, keys are checked at the front, health follows the engine's
process, a drain ends every front (also when every process got the signal), and a front
that dies takes the server down (exit 3)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_tts.client.api import synthesize

from .conftest import ServerProc, config

KEY = "front-key"


def fronts_of(s: ServerProc) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(s.proc.pid), "-f", "grpc_front"],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


async def test_calls_through_front_processes(tmp_path: Path) -> None:
    s = ServerProc(tmp_path, TTS_FRONT_PROCS="2", TTS_API_KEYS=KEY)
    try:
        assert len(fronts_of(s)) == 2
        channels = [grpc.aio.insecure_channel(s.addr) for _ in range(6)]
        results = await asyncio.gather(*(
            synthesize(ch, ["Hello from a front."], config(seed=i), api_key=KEY)
            for i, ch in enumerate(channels)))
        assert all(r.frames > 0 for r in results)
        # the same seed and text give the same audio through any front (to the LSB the
        # contract allows a session batched with others: SessionConfig.seed)
        again = await synthesize(channels[1], ["Hello from a front."], config(seed=0),
                                 api_key=KEY)
        a, b = (np.frombuffer(r.pcm, "<i2").astype(int) for r in (again, results[0]))
        assert len(a) == len(b) and np.abs(a - b).max() <= 1
        meta = (("authorization", f"Bearer {KEY}"),)
        stub = tts_pb2_grpc.TextToSpeechStub(channels[0])
        listed = await stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=meta)
        assert "vivian" in {v.name for v in listed.voices}
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await synthesize(channels[2], ["x"], config(voice="nobody"), api_key=KEY)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as e:  # no key: refused at the front
            await synthesize(channels[3], ["x"], config())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channels[4])
        got = await health.Check(health_pb2.HealthCheckRequest())
        assert got.status == health_pb2.HealthCheckResponse.SERVING
        # a client that goes away mid-stream: its call ends in the engine's process too
        cfg = config()
        cfg.sampling.max_frames = 200
        call = stub.Synthesize(metadata=meta)
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text="Long one.")))
        await call.read()  # SESSION_STARTED
        call.cancel()
        deadline = time.monotonic() + 10
        while s.metric("tts_active_sessions") > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert s.metric("tts_active_sessions") == 0
        for ch in channels:
            await ch.close()
    finally:
        fronts = fronts_of(s)
        assert s.stop() == 0  # SIGTERM: drained, every front gone with it
    assert all(not Path(f"/proc/{pid}").exists() for pid in fronts)


def test_a_front_that_dies_takes_the_server_down(tmp_path: Path) -> None:
    s = ServerProc(tmp_path, TTS_FRONT_PROCS="2")
    fronts = fronts_of(s)
    os.kill(fronts[0], signal.SIGKILL)
    assert s.proc.wait(15) == 3  # the orchestrator restarts it
    s.log.close()
    time.sleep(0.5)
    assert not Path(f"/proc/{fronts[1]}").exists() or \
        Path(f"/proc/{fronts[1]}/status").read_text().find("zombie") >= 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_to_every_process_still_drains(tmp_path: Path, sig: int) -> None:
    """What a signal to the process group does (Ctrl-C: SIGINT; `timeout`, systemd's
    control-group kill: SIGTERM): the fronts wait for the engine's process, which drains
    the call in flight, then ends them. (They died at once before, and the engine's
    process cut its calls UNAVAILABLE as after a crash.)"""
    s = ServerProc(tmp_path, TTS_FRONT_PROCS="2", TTS_DRAIN_TIMEOUT_S="30")
    fronts = fronts_of(s)
    cfg = config()
    cfg.sampling.max_frames = 25
    try:
        async with grpc.aio.insecure_channel(s.addr) as ch:
            call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
            await call.write(tts_pb2.SynthesizeRequest(config=cfg))
            await call.write(tts_pb2.SynthesizeRequest(
                text=tts_pb2.TextDelta(text="Finish this sentence before you go.")))
            await call.done_writing()
            got = [await call.read()]  # SESSION_STARTED
            for pid in [s.proc.pid, *fronts]:
                os.kill(pid, sig)
            while (r := await call.read()) is not grpc.aio.EOF:
                got.append(r)
            assert await call.code() == grpc.StatusCode.OK
        frames = [r.audio for r in got if r.WhichOneof("response") == "audio"]
        assert len(frames) == 25 * 4 and frames[-1].last_in_utterance
        assert s.proc.wait(30) == 0
    finally:
        s.stop()
    assert "front process is gone" not in s.log_path.read_text()
    time.sleep(0.5)
    assert all(not Path(f"/proc/{pid}").exists() for pid in fronts)


def test_auto_sizes_the_fronts_from_the_cpus_the_process_may_use(monkeypatch) -> None:
    import voice_tts.settings as settings_mod
    from voice_tts.settings import TTSSettings, auto_fronts

    assert auto_fronts(50051, 16) == 2 and auto_fronts(50051, 8) == 2
    assert auto_fronts(50051, 7) == 0 and auto_fronts(0, 64) == 0  # small host; port 0
    monkeypatch.delenv("TTS_FRONT_PROCS", raising=False)
    monkeypatch.setattr(settings_mod, "usable_cpus", lambda: 16)
    assert TTSSettings().front_procs == 2  # the default is auto
    assert TTSSettings(grpc_port=0).front_procs == 0
    monkeypatch.setenv("TTS_FRONT_PROCS", "3")
    assert TTSSettings().front_procs == 3
    monkeypatch.setattr(settings_mod, "usable_cpus", lambda: 4)
    monkeypatch.setenv("TTS_FRONT_PROCS", "AUTO")
    assert TTSSettings().front_procs == 0
    monkeypatch.setenv("TTS_FRONT_PROCS", "many")
    with pytest.raises(ValueError, match="or auto"):
        TTSSettings()
