"""The open-loop soak (`bench/soak/`) through a real server: its stream checker on forged
responses, a few seconds of Poisson traffic against the tiny CPU model (every check must
pass, the counts must add up), and on a GPU (`-m gpu`) a short soak at 0.6B."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from voice.tts.v1 import tts_pb2

from bench import soak
from bench.soak.plan import words

ROOT = Path(__file__).resolve().parents[2]  # the repository: the bench's cwd


def run_soak(tmp_path: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess,
                                                                    dict]:
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    r = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--start-server", "--out", str(out),
         "--records", str(tmp_path / "calls.jsonl"), "--server-log",
         str(tmp_path / "server.log"), "--no-samples", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), f"no summary: rc {r.returncode}\n{r.stderr[-4000:]}"
    return r, json.loads(out.read_text())


# --- the checker, without a server ----------------------------------------------------


def frame(seq: int, uid: int = 0, last: bool = False) -> tts_pb2.AudioFrame:
    return tts_pb2.AudioFrame(seq=seq, pcm=b"\0" * 960, utterance_id=uid, start_ms=seq * 20,
                              last_in_utterance=last)


def event(kind: int, uid: int = 0, next_seq: int = 0) -> tts_pb2.Event:
    return tts_pb2.Event(type=kind, utterance_id=uid, next_seq=next_seq)


def checker(kind: str = "normal") -> soak.StreamChecker:
    chk = soak.StreamChecker(soak.Record(0, kind, 10, 10), 0.0, 20, 960, 0.0)
    chk.event(event(tts_pb2.Event.SESSION_STARTED), 0.001)
    chk.event(event(tts_pb2.Event.FIRST_AUDIO), 0.05)
    return chk


def test_checker_accepts_a_clean_stream_and_counts_underruns() -> None:
    chk = checker()
    t0 = 0.1
    for k in range(4):  # the first packet: 4 frames at once
        chk.audio(frame(k), t0 + 0.001 * k)
    for k in range(4, 8):  # the next packet 30 ms after frame 4 was due
        chk.audio(frame(k, last=k == 7), t0 + 0.08 + 0.03)
    chk.event(event(soak.TRUNCATED, 0, 8), t0 + 0.2)
    chk.event(event(tts_pb2.Event.FLUSHED, 0, 8), t0 + 0.2)
    chk.finish()
    r = chk.rec
    assert r.violations == []
    assert (r.frames, r.utterances, r.truncated) == (8, 1, 1)
    assert r.ttfa_ms == pytest.approx(100.0)
    # frames 4..7 are due at +80..+140 ms: 4, 5 late (30, 10 ms); 6, 7 on time
    assert r.late_frames == 2 and r.late_utterances == 1
    assert r.max_late_ms == pytest.approx(30.0)


@pytest.mark.parametrize("bad", ["gap", "start_ms", "size", "next_seq", "after_stop",
                                 "no_first_audio", "flushed_without_last"])
def test_checker_flags_a_broken_stream(bad: str) -> None:
    chk = checker("stop")
    chk.audio(frame(0), 0.1)
    if bad == "gap":
        chk.audio(frame(2), 0.11)
    elif bad == "start_ms":
        f = frame(1)
        f.start_ms = 7
        chk.audio(f, 0.11)
    elif bad == "size":
        f = frame(1)
        f.pcm = b"\0" * 10
        chk.audio(f, 0.11)
    elif bad == "next_seq":
        chk.event(event(tts_pb2.Event.FLUSHED, 1, 5), 0.2)
    elif bad == "after_stop":
        chk.event(event(tts_pb2.Event.STOPPED, 0, 1), 0.2)
        chk.audio(frame(1), 0.21)
    elif bad == "no_first_audio":
        chk.audio(frame(1, uid=1), 0.21)
    elif bad == "flushed_without_last":
        chk.event(event(tts_pb2.Event.FLUSHED, 0, 1), 0.2)
    assert chk.rec.violations, bad


def test_sentences_and_plans() -> None:
    rng = random.Random(1)
    lengths = [len(soak.sentence(rng, 20, 220)) for _ in range(2000)]
    assert min(lengths) >= 20 and max(lengths) <= 220
    text = soak.sentence(rng, 20, 220)
    assert "".join(soak.pieces(rng, text)) == text
    cut = words("Hello there,  streaming world. ")
    assert cut == ["Hello ", "there,  ", "streaming ", "world. "]
    a = soak.parse_args(["--rate", "50", "--duration", "20", "--seed", "3"])
    plans = soak.make_plans(a, [("vivian", ["auto", "english"]), ("ryan", ["auto"])])
    assert 800 < len(plans) < 1200  # Poisson: 1000 expected
    assert all(p2.at > p1.at for p1, p2 in itertools.pairwise(plans))
    kinds = {k: sum(p.kind == k for p in plans) / len(plans) for k in
             ("stop", "reset", "cancel", "normal")}
    assert 0.06 < kinds["stop"] < 0.14 and 0.6 < kinds["normal"] < 0.8
    assert all(p.max_frames == round(len(p.text) * 0.9) for p in plans)
    assert plans == soak.make_plans(a, [("vivian", ["auto", "english"]), ("ryan", ["auto"])])


# --- through a real server ------------------------------------------------------------


@pytest.mark.slow
def test_soak_on_cpu_passes_and_adds_up(tmp_path: Path) -> None:
    r, s = run_soak(
        tmp_path, "--model", "preset:tiny", "--device", "cpu", "--max-sessions", "8",
        "--rate", "1.5", "--duration", "8", "--seed", "7", "--max-chars", "70",
        "--stop-share", "0.2", "--reset-share", "0.2", "--cancel-share", "0.2",
        "--sample-every", "2", "--drain-timeout", "60",
        # the capacity rule of admission (where the server has one) would turn most calls
        # away on 2 busy cores: this test is about the streams, not the capacity
        "--server-env", "TTS_ADMIT_MARGIN=0", timeout=150)
    assert r.returncode == 0 and s["pass"], (s["failures"], r.stderr[-3000:])
    checks = s["checks"]
    for name in ("engine_faults", "server_alive", "server_serving", "no_leaked_slots",
                 "streams_intact", "no_errors", "all_calls_accounted", "clean_shutdown"):
        assert checks[name]["pass"] is True, (name, checks[name])
    assert checks["gpu_memory_flat"]["pass"] is None  # CPU: nothing to sample
    n = s["arrivals"]
    assert n == checks["all_calls_accounted"]["planned"] >= 6
    assert sum(s["counts"].values()) == sum(s["by_code"].values()) == n
    assert s["counts"].get("rejected", 0) == s["rejections"]["n"] == \
        s["by_code"].get("RESOURCE_EXHAUSTED", 0)
    admitted = n - s["rejections"]["n"]
    assert s["session_started_ms"]["n"] == admitted >= 4
    assert s["ttfa_ms"]["n"] >= admitted - s["no_audio_calls"] - s["counts"].get("cancelled", 0)
    assert s["frames"] > 0 and s["underruns"]["frames"] == s["frames"]
    assert 0 <= s["underruns"]["late_frames"] <= s["frames"]
    assert s["server_metrics_end"]["frames_sent"] >= s["frames"]
    assert s["server_metrics_end"]["active_sessions"] == 0
    done = {k: v["done"] for k, v in s["actions"].items()}
    assert sum(done.values()) >= 1, s["actions"]
    assert s["counts"].get("cancelled", 0) == done.get("cancel", 0)
    assert s["client"]["grpc_write_fix"] is True
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == n and sum(c["frames"] for c in calls) == s["frames"]
    assert "soak PASSED" in r.stderr


@pytest.mark.gpu
@pytest.mark.timeout(900)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_soak_on_gpu_0_6b(tmp_path: Path) -> None:
    r, s = run_soak(
        tmp_path, "--model", "preset:0.6b", "--device", "cuda", "--max-sessions", "64",
        "--rate", os.environ.get("SOAK_TEST_RATE", "20"),
        "--duration", os.environ.get("SOAK_TEST_DURATION", "30"), "--procs", "2",
        "--startup-timeout", "500", "--drain-timeout", "60", timeout=840)
    print(json.dumps({k: s[k] for k in ("counts", "ttfa_ms", "underruns", "rejections",
                                        "gpu_memory_mb", "client")}, indent=1))
    assert r.returncode == 0 and s["pass"], (s["failures"], r.stderr[-3000:])
    assert s["checks"]["gpu_memory_flat"]["pass"] is True
    assert s["checks"]["engine_faults"]["pass"] is True
    assert s["counts"].get("ok", 0) > 0
