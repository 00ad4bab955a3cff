"""End to end: the suite over the REAL agent (direct transport: AgentSession on the
agent's real-time microphone/speaker), real TTS and thinker gRPC servers with tiny
random models, started by `run_suite --spawn-backends`, exactly as a user runs it.

One `--quick` run (2 clean P0 cases + 4 P1 fault cases: a decoder fault and three
live link impairments), then checks:
- clean cases: captured OK, every transport gate PASS, pre vs post identical in quality;
- P1 cases: the gates each fault must break FAIL (the gates can fail), and the link
  faults acted live (the listener's clock saw the stall, the lost and late packets);
- report.md, report.json, PNG plots and the WAVs are written; latencies are measured.
No fakes: nothing here stands in for the agent, the TTS or the thinker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import e2e_output_root, sender_made_the_gaps
from voice_autortc.gates import TRANSPORT_GATES

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = e2e_output_root()
    shutil.rmtree(out / "ci-quick", ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-m", "voice_autortc.run_suite", "--transport", "direct",
         "--spawn-backends", "--quick", "--output-root", str(out), "--run-id", "ci-quick",
         "--no-progress"],
        capture_output=True, text=True, timeout=900)
    run_dir = out / "ci-quick"
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    report = json.loads((run_dir / "report.json").read_text())
    print(proc.stderr[-3000:])
    return {"dir": run_dir, "report": report, "rc": proc.returncode, "log": proc.stderr,
            "cases": {c["case_id"]: c for c in report["cases"]}}


def _gates(case: dict[str, Any]) -> dict[str, str]:
    return {g["name"]: g["status"] for g in case["gates"]}


def test_all_quick_cases_ran(run: dict[str, Any]) -> None:
    assert set(run["cases"]) == {"endpoint_short_hello", "endpoint_long_sentence",
                                 "p1_boom", "p1_stall", "p1_loss", "p1_jitter"}
    # The exit code follows the verdict.
    assert run["rc"] == (0 if run["report"]["verdict"] == "PASS" else 1)


def test_clean_cases_pass_transport_and_quality_gates(run: dict[str, Any]) -> None:
    for cid in ("endpoint_short_hello", "endpoint_long_sentence"):
        c = run["cases"][cid]
        m = c["metrics"]
        assert c["capture_status"] == "OK", (cid, c["error"], c["notes"])
        g = _gates(c)
        bad = {n for n in TRANSPORT_GATES if g[n] != "PASS"}
        # The clean link adds nothing: every frame sent arrived, none lost or late.
        assert m["link_dropped"] == m["rx_lost"] == m["rx_late"] == 0, m
        if sender_made_the_gaps(bad, m):
            warnings.warn(f"{cid}: {sorted(bad)} FAIL with the sender late "
                          f"({m['sender_late_frames']:.0f} frames, {m['sender_late_ms']} ms, "
                          f"its longest pause {m.get('sender_gap_max_ms')} ms, "
                          f"host load {run['report']['run']['host_load']})", stacklevel=1)
        else:
            assert not bad, (cid, bad, m, f"see {run['dir']}/report.md")
        assert g["clipping_ratio"] == g["spikes"] == g["audio_valid"] == "PASS", m
        # Nothing between the TTS and the speaker: pre and post must be the same sound.
        assert g["mel_distance"] == "PASS" and g["hf_ratio_drop"] == "PASS", m
        assert g["speed_drift"] == "PASS", m


def test_p1_faults_fail_their_gates(run: dict[str, Any]) -> None:
    for cid in ("p1_boom", "p1_stall", "p1_loss", "p1_jitter"):
        c = run["cases"][cid]
        assert c["capture_status"] == "OK", (cid, c["error"])
        g = _gates(c)
        assert c["expect_fail"] and all(g[n] == "FAIL" for n in c["expect_fail"]), (cid, g)
        assert c["verdict"] == "PASS" and c["detected"] == c["expect_fail"]


def test_link_faults_happened_live(run: dict[str, Any]) -> None:
    # The impairments acted on the stream as it played, seen by the listener's clock.
    m = {cid: run["cases"][cid]["metrics"] for cid in ("p1_stall", "p1_loss", "p1_jitter")}
    assert m["p1_stall"]["inter_arrival_max_ms"] >= 170  # 180 ms of nothing, then a burst
    assert m["p1_stall"]["link_dropped"] == m["p1_stall"]["rx_lost"] == 0  # late, not lost
    assert m["p1_loss"]["link_dropped"] > 0 and m["p1_loss"]["rx_lost"] > 0
    assert m["p1_loss"]["speed_drift"] > 0.02  # lost audio is missing from what was heard
    assert m["p1_jitter"]["rx_lost"] + m["p1_jitter"]["rx_late"] > 0
    assert m["p1_jitter"]["inter_arrival_p95_ms"] > 30


def test_latencies_are_measured(run: dict[str, Any]) -> None:
    for c in run["cases"].values():
        m = c["metrics"]
        assert 0 < m["eot_to_first_audio_ms"] < 30_000, (c["case_id"], m)
        assert m["llm_ttft_ms"] is not None and m["llm_ttft_ms"] > 0
        assert m["tts_ttfa_ms"] is not None and m["tts_first_to_publish_ms"] is not None
        assert c["agent_turns"], c["case_id"]
    agg = run["report"]["aggregates"]
    assert agg["eot_to_first_audio_p95_ms"] >= agg["eot_to_first_audio_p50_ms"] > 0
    assert agg["p0_valid_rate"] == 1.0


def test_report_plots_and_wavs_written(run: dict[str, Any]) -> None:
    d: Path = run["dir"]
    md = (d / "report.md").read_text()
    assert md.startswith("# AutoRTC report:") and "## Suite gates" in md
    assert "| p1_stall | P1 | link: stall 180 ms | OK |" in md
    assert (d / "plots" / "latency.png").read_bytes()[:8] == PNG
    for cid in run["cases"]:
        cd = d / "cases" / cid
        assert (cd / "reply.png").read_bytes()[:8] == PNG
        for wav in ("input.wav", "pre_rtc.wav", "post_rtc_reply.wav", "post_rtc_full.wav"):
            assert (cd / wav).stat().st_size > 1000, (cid, wav)
        assert f"![{cid}](cases/{cid}/reply.png)" in md
