"""What operators and users meet: health, reflection, /metrics, SIGTERM drain, the CLI."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import urllib.request
import wave
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import config
from .test_streaming import audio, drain, read_until, text


async def test_health_and_reflection(server) -> None:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        h = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="voice.tts.v1.TextToSpeech"))
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        names = []
        async for r in stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
            names = [s.name for s in r.list_services_response.service]
    assert "voice.tts.v1.TextToSpeech" in names and "grpc.health.v1.Health" in names
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/healthz") as r:
        assert r.status == 200


async def test_metrics_after_a_session(server) -> None:
    before = server.metric("tts_frames_sent_total")
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=config()))
        await call.write(text("Count my frames."))
        await call.done_writing()
        n = len(audio(await drain(call)))
    m = server.metrics()
    for name in ("tts_ttfa_seconds_bucket", "tts_rtf_bucket", "tts_active_sessions",
                 "tts_engine_step_seconds_bucket", "tts_engine_batch_size_bucket",
                 "tts_errors_total"):
        assert name in m, name
    assert server.metric("tts_frames_sent_total") - before == n
    assert server.metric("tts_ttfa_seconds_count") >= 1
    # what is served and how, for dashboards and benchmarks (the fixture runs no fronts)
    assert server.metric('tts_server_info{front_procs="0",device="cpu",'
                         'first_step_apart_max_rows="32",admit_frame_budget_ms="0"}') == 1


async def test_sigterm_drains_in_flight_then_exits(make_server) -> None:
    srv = make_server(TTS_DRAIN_TIMEOUT_S="30")
    cfg = config()
    cfg.sampling.max_frames = 25
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        call = stub.Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text("Finish this sentence before you go."))
        await call.write(tts_pb2.SynthesizeRequest(
            control=tts_pb2.Control(type=tts_pb2.Control.FLUSH)))
        await read_until(call, lambda r: r.WhichOneof("response") == "audio")
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        # A new call is refused (once its client stops writing: test_refusal_status.py).
        late_code = await stub.Synthesize().code()
        assert late_code == grpc.StatusCode.UNAVAILABLE
        rest = await read_until(call, lambda r: r.WhichOneof("response") == "event"
                                and r.event.type == tts_pb2.Event.FLUSHED)
        assert audio(rest)
        await call.done_writing()
    assert srv.proc.wait(30) == 0


async def test_calls_open_at_the_drain_timeout_get_unavailable(make_server) -> None:
    srv = make_server(TTS_DRAIN_TIMEOUT_S="1", TTS_CONFIG_TIMEOUT_S="60")
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        speaking = stub.Synthesize()
        await speaking.write(tts_pb2.SynthesizeRequest(config=config()))
        # Text still streaming (no FLUSH): the utterance waits for more, past the drain.
        await speaking.write(text("This reply is still being written "))
        await read_until(speaking, lambda r: r.WhichOneof("response") == "event")
        silent = stub.Synthesize()  # open, but no SessionConfig yet
        await silent.wait_for_connection()
        await asyncio.sleep(0.5)
        srv.proc.send_signal(signal.SIGTERM)
        for call in (speaking, silent):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await drain(call)  # the status comes after the frames still unread
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
            details = e.value.details() or ""
            assert "server drained" in details and "another replica" in details, details
    assert srv.proc.wait(30) == 0


def test_cli_writes_a_wav_and_prints_ttfa(server, tmp_path: Path) -> None:
    out = tmp_path / "reply.wav"
    r = subprocess.run([sys.executable, "-m", "voice_tts.client", "--addr", server.addr,
                        "--text", "Hello from the command line.", "--out", str(out),
                        "--rate", "16000", "--greedy", "--seed", "1", "--max-frames", "10"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TTFA" in r.stdout and "RTF" in r.stdout
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2
        assert abs(w.getnframes() / 16000 - 0.8) < 0.05  # 10 codec frames = 0.8 s


def test_cli_streams_stdin(server, tmp_path: Path) -> None:
    out = tmp_path / "stdin.wav"
    r = subprocess.run([sys.executable, "-m", "voice_tts.client", "--addr", server.addr,
                        "--stdin", "--out", str(out), "--greedy", "--max-frames", "5"],
                       input="Streamed from standard input.", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        assert w.getnframes() == 5 * 1920


def test_cli_says_what_to_do_when_nothing_answers(tmp_path: Path) -> None:
    from voice_testkit import free_port

    r = subprocess.run([sys.executable, "-m", "voice_tts.client", "--addr",
                        f"127.0.0.1:{free_port()}", "--text", "Hi.", "--out",
                        str(tmp_path / "x.wav")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr
    assert "is the stack up? `make up`" in r.stderr, r.stderr


def test_help_and_bad_env() -> None:
    for mod in ("voice_tts.server", "voice_tts.client"):
        r = subprocess.run([sys.executable, "-m", mod, "--help"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and "usage" in r.stdout.lower()
    r = subprocess.run([sys.executable, "-m", "voice_tts.server"], capture_output=True,
                       text=True, timeout=60, env={"TTS_MAX_SESSIONS": "zero", "PATH": "/usr/bin"})
    assert r.returncode != 0 and "max_sessions" in r.stderr.lower()


def test_slots_batch_kv_rows_and_prefills_come_from_the_env() -> None:
    """TTS_MAX_SESSIONS (slots), TTS_MAX_BATCH (rows a step advances, never more than the
    slots), TTS_MAX_SEQ_LEN (KV rows a slot holds) and TTS_MAX_PREFILLS reach the engine."""
    from voice_tts.server.server import load_engine
    from voice_tts.settings import TTSSettings

    engine = load_engine(TTSSettings(model="preset:tiny", max_sessions=3, max_batch=8,
                                     max_seq_len=200, max_prefills=2))
    s = engine.settings
    assert (s.max_sessions, s.max_batch, s.max_seq_len, s.max_prefills_per_step) == (3, 3, 200, 2)
    assert engine.runner.max_seq_len == 200
    assert load_engine(TTSSettings(model="preset:tiny", max_sessions=9,
                                   max_batch=4)).settings.max_batch == 4


async def test_a_session_logs_one_info_line_at_its_end_with_its_numbers(server) -> None:
    """Nothing per frame, utterance or session start at INFO (the hot path at hundreds of
    streams); one line when the session ends: its frames, each utterance's TTFA, its end."""
    cfg = config(session_id="log-once-ok", frames_per_message=1)
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text("One."))
        await call.write(tts_pb2.SynthesizeRequest(control=tts_pb2.Control(
            type=tts_pb2.Control.FLUSH)))
        await call.write(text("Two."))
        await call.done_writing()
        n = len(audio(await drain(call)))
        cut = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        # 4 s of audio (greedy speaks this text to the cap), still being paced when cut: a
        # session whose audio is all out when the cancel comes may see it as the end of
        # its input first (grpc.aio), and end ok
        cut_cfg = config(session_id="log-once-cut")
        cut_cfg.sampling.max_frames = 50
        await cut.write(tts_pb2.SynthesizeRequest(config=cut_cfg))
        await cut.write(text("Hello there, how are you today? " * 4))
        await read_until(cut, lambda r: r.HasField("audio"))
        cut.cancel()
    lines: list[str] = []
    for _ in range(200):  # the end line follows the call's end on the server's loop
        lines = [x for x in server.log_path.read_text().splitlines()
                 if "log-once-" in x and " INFO " in x]
        if len(lines) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(lines) == 2, lines
    [ok] = [x for x in lines if "session=log-once-ok " in x]
    [cut_line] = [x for x in lines if "session=log-once-cut " in x]
    assert "session ended protocol=grpc session=log-once-ok" in ok, lines
    assert f"frames={n} " in ok and "end=ok" in ok
    ttfas = ok.split("ttfa_ms=[")[1].split("]")[0].split(", ")
    assert len(ttfas) == 2 and all(float(t) > 0 for t in ttfas), ok  # one per utterance
    assert "session=log-once-cut" in cut_line and "end=client_cancelled" in cut_line
