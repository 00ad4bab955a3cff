"""Turn-taking gates proven on the REAL agent (direct transport, real TTS and thinker
servers with tiny models, `run_suite --spawn-backends`), each by a run that breaks what
it guards:

- barge_in_cut: with interruptions on, the reply falls silent soon after the user's
  "Stop." begins (PASS); the same case with AGENT_ALLOW_INTERRUPTIONS=false plays on
  over the user, and the gate FAILs.
- early_reply: a 600 ms pause inside the user's sentence; today the agent answers in
  the pause, and the gate FAILs (the case is a marked known issue: XFAIL, the suite
  still passes). When the agent learns to wait, this test says to drop the marks.
Two runs, three short cases, ~70 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import e2e_output_root, sender_made_the_gaps

CASES = Path(__file__).parent / "cases" / "turn_taking.json"


def _run(out: Path, run_id: str, cases: list[str], env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "voice_autortc.run_suite", "--transport", "direct",
           "--spawn-backends", "--cases", str(CASES), "--output-root", str(out),
           "--run-id", run_id, "--no-progress", "--retries", "0"]
    for c in cases:
        cmd += ["--case", c]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    report = json.loads((out / run_id / "report.json").read_text())
    return {c["case_id"]: c for c in report["cases"]} | {"_verdict": report["verdict"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = e2e_output_root()
    env = {"AGENT_ALLOW_INTERRUPTIONS": "true"}
    return {
        "clean": _run(out, "turn-taking", ["barge_short", "stutter_short"], env),
        "no_interruptions": _run(out, "turn-taking-no-interruptions", ["barge_short"],
                                 {"AGENT_ALLOW_INTERRUPTIONS": "false"}),
    }


def _gate(case: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in case["gates"] if g["name"] == name)


def test_barge_in_cuts_the_reply(runs: dict[str, dict[str, Any]]) -> None:
    c = runs["clean"]["barge_short"]
    g = _gate(c, "barge_in_cut")
    assert c["capture_status"] == "OK", (c["error"], c["notes"])
    assert g["status"] == "PASS", (g, c["metrics"])
    assert 0 < g["value"] <= g["threshold"]


def test_barge_in_gate_fails_without_interruptions(runs: dict[str, dict[str, Any]]) -> None:
    c = runs["no_interruptions"]["barge_short"]
    g = _gate(c, "barge_in_cut")
    assert c["capture_status"] == "OK", (c["error"], c["notes"])
    # The reply played on over the user's "Stop.": the gate FAILs, so does the case.
    assert g["status"] == "FAIL" and g["value"] > 2 * g["threshold"], (g, c["metrics"])
    assert c["verdict"] == "FAIL" and runs["no_interruptions"]["_verdict"] == "FAIL"


def test_mid_sentence_reply_fails_early_reply(runs: dict[str, dict[str, Any]]) -> None:
    c = runs["clean"]["stutter_short"]
    g = _gate(c, "early_reply")
    assert c["capture_status"] == "OK", (c["error"], c["notes"])
    if c["verdict"] == "XPASS":
        pytest.fail("the agent no longer answers inside a 600 ms pause: drop the `xfail` "
                    "of stutter_long_pause (all_cases.json) and stutter_short (tests/cases)")
    # Today: the agent is audible before the user's last word, the gate FAILs; the
    # known-issue mark keeps the suite green without weakening the gate.
    assert g["status"] == "FAIL" and g["value"] > 0, (g, c["metrics"])
    assert c["verdict"] == "XFAIL"
    # the suite is green but for underruns the agent's own speaker made (see conftest)
    barge = runs["clean"]["barge_short"]
    failed = {g["name"] for g in barge["gates"] if g["status"] == "FAIL"}
    assert runs["clean"]["_verdict"] == "PASS" or sender_made_the_gaps(
        failed, barge["metrics"]), (failed, barge["metrics"])
