"""The open-loop benchmark (`bench/openloop.py`): a sweep of two rates through one real
server (tiny model, CPU) with the shipped prompt set; every row adds up, and the prompt
set keeps the length profile it documents."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.prompts import make_prompts
from bench.soak.report import peak_inflight

ROOT = Path(__file__).resolve().parents[2]  # the repository: the bench's cwd


def test_prompt_set_is_the_documented_one() -> None:
    shipped = make_prompts.OUT.read_text().splitlines()
    assert shipped == make_prompts.make(), "rerun python -m bench.prompts.make_prompts"
    lens = [len(s) for s in shipped]
    assert len(lens) == 1088 and 70 <= statistics.median(lens) <= 90
    assert sum(40 <= n <= 150 for n in lens) / len(lens) >= 0.8
    assert all(s[-1] in ".?!" for s in shipped if len(s) < make_prompts.HI)
    one_token = make_prompts.OUT_ONE_TOKEN.read_text().splitlines()
    assert one_token == make_prompts.first_word_one_token(shipped)
    assert {s.split(" ")[0] for s in one_token} == {"The", "A"}


def test_peak_inflight_sweeps_dispatch_and_end() -> None:
    recs = [{"dispatch_at": 0.0, "end_ms": 1000.0}, {"dispatch_at": 0.5, "end_ms": 1000.0},
            {"dispatch_at": 1.0, "end_ms": 100.0}, {"dispatch_at": 2.0, "end_ms": None}]
    # The first ends as the third starts: two at once, never three.
    assert peak_inflight(recs) == 2


@pytest.mark.slow
def test_sweep_on_cpu_reports_each_rate(tmp_path: Path) -> None:
    out = tmp_path / "ol.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    r = subprocess.run(
        [sys.executable, "-m", "bench.openloop", "--start-server", "--model", "preset:tiny",
         "--max-sessions", "8", "--rates", "0.5,1", "--duration", "6", "--warmup", "2",
         "--procs", "2", "--out", str(out), "--server-log", str(tmp_path / "server.log"),
         "--server-env", "TTS_ADMIT_MARGIN=0", "--stop-above-ms", "60000"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.exists(), r.stderr[-4000:]
    result = json.loads(out.read_text())
    assert [row["rate"] for row in result["rows"]] == [0.5, 1.0], r.stderr[-3000:]
    # what was served, as the server says (ListVoices), beside what was asked for
    assert "tiny" in result["model"] and result["model_asked"] == "preset:tiny"
    assert result["frames_per_message"] == 1
    # and how it was set up, as the server says (tts_server_info on /metrics)
    served = result["served"]
    assert served["model"] == result["model"] and served["device"] == "cpu"
    assert served["max_sessions"] == "8" and served["log_level"] == "INFO"
    assert int(served["front_procs"]) >= 0  # auto, as the server resolved it on this host
    for row in result["rows"]:
        assert row["pass"], row["failures"]
        assert row["calls"] >= 1 and sum(row["by_code"].values()) == row["calls"]
        assert row["ttfa_ms"]["n"] == row["calls"] - row["rejected"]
        u = row["underruns"]
        assert u["late_frames"] >= u["over_20ms"] >= u["over_100ms"] >= 0
        assert 1 <= row["peak_inflight"] <= row["calls"]
        assert row["audio_s_per_wall_s"] > 0 and len(row["client_cpu_share"]) == 2
        # the server's split of its TTFA: parts of the first packet's time, each call's
        parts = row["server_parts_ms"]
        assert {p["n"] for p in parts.values()} == {row["server_ttfa_ms"]["n"]}
        assert parts["queue"]["p50"] + parts["prefill"]["p50"] <= \
            parts["first_packet"]["p50"] <= row["server_ttfa_ms"]["p50"]
    assert r.returncode == 0
    assert r.stderr.count("openloop: rate ") == 2


@pytest.mark.slow
def test_sweep_with_cloned_voices_on_cpu(tmp_path: Path) -> None:
    """`--clone-voices 2` on a tiny Base server: two voices made (timed) in a temporary
    library, probed, every call of the sweep speaks with one of them, both deleted."""
    out = tmp_path / "ol.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
    log = tmp_path / "server.log"
    r = subprocess.run(
        [sys.executable, "-m", "bench.openloop", "--start-server", "--model",
         "preset:tiny-base", "--max-sessions", "8", "--rates", "1", "--duration", "5",
         "--warmup", "0", "--procs", "1", "--clone-voices", "2", "--clone-seconds", "4",
         "--clone-audio", "synth", "--out", str(out), "--server-log", str(log),
         "--server-env", "TTS_ADMIT_MARGIN=0", "--stop-above-ms", "60000", "--seed", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), r.stderr[-4000:]
    result = json.loads(out.read_text())
    c = result["clones"]
    names = ["olclone000", "olclone001"]
    assert c["names"] == names and c["mode"] == "icl" and c["audio"] == "synthetic"
    assert len(c["create_ms"]) == 2 and all(ms > 0 for ms in c["create_ms"])
    assert all(len(c["probe_ttfa_ms"][n]) == 2 for n in names)
    assert c["first_use_ttfa_ms_median"] > 0 and c["cached_use_ttfa_ms_median"] > 0
    assert c["deleted"] == 2
    assert any(kv.startswith("TTS_VOICE_DIR=") for kv in result["server_env"])
    [row] = result["rows"]
    assert row["pass"], row["failures"]
    assert row["calls"] >= 1 and row["by_code"] == {"OK": row["calls"]}
    assert set(row["voices_used"]) <= set(names)
    assert sum(row["voices_used"].values()) == row["calls"]
    text = log.read_text()
    for n in names:
        assert f"created clone voice '{n}'" in text and f"deleted '{n}'" in text
    assert r.returncode == 0, r.stderr[-3000:]
