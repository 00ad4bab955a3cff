"""report.md / report.json / PNG plots / --compare from judged cases (no agent needed)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import received, speechlike
from voice_autortc.cases import load_cases
from voice_autortc.compare import compare_markdown
from voice_autortc.compare import main as compare_main
from voice_autortc.gates import GATES
from voice_autortc.plots import latency_plot, reply_plot
from voice_autortc.report import build_json, build_markdown, write_report
from voice_autortc.transports.base import OK, Capture
from voice_autortc.verdict import judge_case, judge_suite

CASES = {c.id: c for c in load_cases()[0].cases}
PNG = b"\x89PNG\r\n\x1a\n"


def _results(eot_ms: float = 400.0) -> list:
    out = []
    for cid in ("endpoint_short_hello", "p1_distort", "p1_boom"):
        pre = speechlike(seed=2)
        rx = received(pre.copy())
        cap = Capture(case_id=cid, trace_id=f"tr-{cid}", status=OK, rate=rx.rate, full=pre,
                      reply=rx, pre=pre, pre_rate=rx.rate, eot=1.0,
                      first_audible=1.0 + eot_ms / 1000,
                      agent_turns=[{"llm_ttft_ms": 50.0, "tts_first_to_publish_ms": 2.0}],
                      transcript=[{"role": "user", "text": CASES[cid].input.text or ""}])
        out.append(judge_case(CASES[cid], cap, GATES))
    return out


def _report(tmp_path: Path, eot_ms: float, name: str) -> dict:
    results = _results(eot_ms)
    verdict, agg, sg = judge_suite(results, GATES)
    run = {"trace_id": name, "transport": "direct", "mode": "test", "case_file": "x",
           "started_at": "now", "duration_s": 1.0, "gates": {}}
    rep = build_json(run, verdict, agg, sg, results)
    d = tmp_path / name
    d.mkdir()
    write_report(d, rep, build_markdown(rep, results, sg))
    return rep


def test_markdown_has_verdict_tables_and_fixes(tmp_path: Path) -> None:
    rep = _report(tmp_path, 400, "run1")
    md = (tmp_path / "run1" / "report.md").read_text()
    assert md.startswith("# AutoRTC report: PASS")
    assert "PRIMARY KPI" in md and "| max gap in reply |" in md
    assert "### p1_distort (P1) — PASS" in md and "detected: clipping_ratio" in md
    # A P1 case's failing gates are expected: no Suggested Fix for them.
    assert "None: every gate passed" in md
    assert rep["capture_status"] == {"OK": 3}
    assert json.loads((tmp_path / "run1" / "report.json").read_text())["verdict"] == "PASS"


def test_failing_gate_names_its_suggested_fix(tmp_path: Path) -> None:
    results = _results()
    results[0].case = CASES["endpoint_short_hello"]
    results[0].gates[1] = results[0].gates[1].__class__(
        **{**results[0].gates[1].__dict__, "status": "FAIL"})
    verdict, agg, sg = judge_suite(results, GATES)
    run = {"trace_id": "r", "transport": "direct", "mode": "t", "case_file": "x",
           "started_at": "now", "duration_s": 1.0, "gates": {}}
    md = build_markdown(build_json(run, verdict, agg, sg, results), results, sg)
    name = results[0].gates[1].name
    assert f"- **{name}** FAIL (endpoint_short_hello):" in md


def test_plots_are_png(tmp_path: Path) -> None:
    pre = speechlike()
    rx = received(pre)
    p = reply_plot(tmp_path / "r.png", case_id="c", post=rx.audio, rate=rx.rate,
                   arrivals=rx.arrivals, pre=pre, pre_rate=rx.rate, silence_dbfs=-50,
                   gap_min_ms=40)
    q = latency_plot(tmp_path / "l.png", [{"case_id": "a", "eot_to_first_audio_ms": 500.0,
                                           "llm_ttft_ms": 60.0}], 650)
    for f in (p, q):
        assert f.read_bytes()[:8] == PNG and f.stat().st_size > 5000


def test_compare_flags_regression(tmp_path: Path, capsys) -> None:
    old = _report(tmp_path, 300, "old")
    new = _report(tmp_path, 380, "new")
    md = compare_markdown(old, new)
    assert "eot_to_first_audio_p95_ms | 300.0 | 380.0 | +80 | ⚠ regression" in md
    assert "endpoint_short_hello" in md  # its figure moved by more than 30 ms
    same = compare_markdown(old, old)
    assert "⚠" not in same
    assert compare_main([str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    assert "regression" in capsys.readouterr().out
    assert compare_main([str(tmp_path / "old"), str(tmp_path / "nope")]) == 2


def test_sender_late_dropout_gets_the_sender_fix() -> None:
    pre = speechlike(seed=4)
    post = pre.copy()
    post[24000:27600] = 0.0  # 150 ms gap where pre had speech
    cap = Capture(case_id="endpoint_short_hello", trace_id="t", status=OK, rate=24000,
                  full=post, reply=received(post), pre=pre, pre_rate=24000, eot=1.0,
                  first_audible=1.4, sender={"sender_late_frames": 2.0,
                                             "sender_late_ms": 150.0})
    r = judge_case(CASES["endpoint_short_hello"], cap, GATES)
    assert "audible_dropouts" in {g.name for g in r.failed()}
    verdict, agg, sg = judge_suite([r], GATES)
    run = {"trace_id": "r", "transport": "direct", "mode": "t", "case_file": "x",
           "started_at": "now", "duration_s": 1.0, "gates": {}}
    md = build_markdown(build_json(run, verdict, agg, sg, [r]), [r], sg)
    assert "endpoint_short_hello (sender late)" in md and "ran behind real time" in md
    assert "sender behind real time: 2 frame(s)" in md
