"""report.json (for machines) and report.md (for people) of one run.

report.json is the stable record `--compare` reads: run info, the suite verdict,
aggregates (with the primary KPI), suite gates, and per case: capture_status,
metrics, gates, verdict. report.md puts the verdict and the primary KPI first (seed
003 16.1), then the suite gates, a table per case, the Suggested Fixes of every
failing gate, and links to the plots and WAVs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .gates import FAIL, GateResult
from .verdict import PRIMARY_KPI, CaseResult

_KEYS_MD = (  # the figures shown per case, in this order
    "eot_to_first_audio_ms", "agent_eot_to_first_audio_ms", "llm_ttft_ms", "tts_ttfa_ms",
    "tts_first_to_publish_ms", "stt_ms", "cancel_to_silence_ms", "audible_ms", "post_rms",
    "max_gap_ms", "audible_dropouts", "clipping_ratio", "spikes", "inter_arrival_p50_ms",
    "inter_arrival_p95_ms", "inter_arrival_max_ms", "early_reply_ms",
    "barge_in_to_silence_ms", "backchannel_after_ms", "backchannel_unplayed_ms",
    "backchannel_pause_ms",
    "link_dropped", "rx_lost", "rx_late", "mel_distance_db",
    "hf_ratio_drop_db", "speed_drift",
    "sender_late_frames", "sender_late_ms", "sender_delivery_rtf", "sender_gap_max_ms",
)


def _fmt(v: object) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1 and v != 0 else f"{v:.1f}"
    return str(v)


def case_json(r: CaseResult) -> dict[str, Any]:
    c = r.capture
    return {
        "case_id": r.case.id, "priority": r.case.priority, "trace_id": c.trace_id,
        "description": r.case.description,
        "fault": r.case.fault_label() if r.case.fault or r.case.link else None,
        "capture_status": c.status, "error": c.error, "slicing": c.slicing,
        "attempts": r.attempts, "verdict": r.verdict, "expect_fail": r.case.expect_fail,
        "detected": r.detected, "metrics": r.metrics, "notes": c.notes,
        "gates": [g.to_json() for g in r.gates], "agent_turns": c.agent_turns,
        "transcript": c.transcript,
    }


def build_json(run: dict[str, Any], verdict: str, agg: dict[str, Any],
               suite_gates: list[GateResult], results: list[CaseResult]) -> dict[str, Any]:
    return {
        "run": run, "verdict": verdict, "primary_kpi": {
            "name": PRIMARY_KPI, "value": agg.get(PRIMARY_KPI),
            "baseline": agg.get("baseline_kpi_ms"), "delta": agg.get("kpi_regression_ms")},
        "aggregates": agg, "suite_gates": [g.to_json() for g in suite_gates],
        "capture_status": dict(Counter(r.capture.status for r in results)),
        "cases": [case_json(r) for r in results],
    }


def _load_line(run: dict[str, Any]) -> list[str]:
    load = run.get("host_load")
    if not load:
        return []
    return [f"host load (1/5/15 min) at start {load['start']}, at end {load['end']}, "
            f"{load['cpus']} CPUs: Ring0 underruns on a busy host measure the host.", ""]


def _gate_row(g: GateResult) -> str:
    mark = {"PASS": "✅ PASS", "FAIL": "❌ FAIL"}.get(g.status, "⚪ SKIP")
    return f"| {g.title} | {_fmt(g.value)} | {g.op} {_fmt(g.threshold)} {g.unit} | {mark} |"


def build_markdown(report: dict[str, Any], results: list[CaseResult],
                   suite_gates: list[GateResult], compare_md: str = "") -> str:
    run, agg, kpi = report["run"], report["aggregates"], report["primary_kpi"]
    lines = [
        f"# AutoRTC report: {report['verdict']}",
        "",
        f"run `{run['trace_id']}` · transport `{run['transport']}` · mode `{run['mode']}` · "
        f"{run['started_at']} · {run['duration_s']:.0f} s · cases {len(results)}",
        "",
        *_load_line(run),
        f"**PRIMARY KPI** {kpi['name']} = {_fmt(kpi['value'])} ms"
        + (f" (baseline {_fmt(kpi['baseline'])} ms, Δ {_fmt(kpi['delta'])} ms)"
           if kpi["baseline"] is not None else " (no baseline)"),
        "",
        f"retry rate {_fmt(agg.get('retry_rate'))} · errors {_fmt(agg.get('error_cases'))}",
        "",
        "capture_status: " + ", ".join(f"{k} {v}" for k, v in
                                       sorted(report["capture_status"].items())),
        "",
        "## Suite gates (over P0 cases)",
        "",
        "| gate | value | threshold | status |",
        "|---|---|---|---|",
        *[_gate_row(g) for g in suite_gates],
        "",
        "## Cases",
        "",
        "| case | prio | fault | capture_status | EoT→audio ms | gates failed | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        failed = ", ".join(g.name for g in r.failed()) or "-"
        fault = r.case.fault_label()
        v = r.verdict + (f" (detected {len(r.detected)}/{len(r.case.expect_fail)})"
                         if r.case.priority == "P1" else "")
        lines.append(f"| {r.case.id} | {r.case.priority} | {fault} | {r.capture.status} | "
                     f"{_fmt(r.metrics.get('eot_to_first_audio_ms'))} | {failed} | {v} |")
    lines += ["", "![latency](plots/latency.png)", ""]
    for r in results:
        lines += _case_md(r)
    fixes = _fixes(results, suite_gates)
    lines += ["## Suggested Fixes", ""]
    lines += fixes or ["None: every gate passed (P1 faults were detected as expected)."]
    if compare_md:
        lines += ["", compare_md]
    return "\n".join(lines) + "\n"


def _case_md(r: CaseResult) -> list[str]:
    """One case's section: its capture, its fault, notes on the sender, its gates, what
    was said, its figures and its reply's plot."""
    lines = [f"### {r.case.id} ({r.case.priority}) — {r.verdict}", ""]
    if r.case.description:
        lines += [r.case.description, ""]
    lines.append(f"trace `{r.capture.trace_id}` · capture_status **{r.capture.status}** · "
                 f"slicing {r.capture.slicing} · attempts {r.attempts}")
    if r.case.priority == "P1":
        lines.append(f" · fault **{r.case.fault_label()}** must fail "
                     f"{', '.join(r.case.expect_fail)}; detected: "
                     f"{', '.join(r.detected) or 'none'}")
    if r.case.xfail:
        lines.append(f" · known issue (xfail): {r.case.xfail}")
    if r.capture.error:
        lines.append(f"\n> error: {r.capture.error}")
    for n in r.capture.notes:
        lines.append(f"\n> note: {n}")
    late = r.metrics.get("sender_late_frames")
    if isinstance(late, float) and late > 0:
        lines.append(f"\n> sender behind real time: {late:.0f} frame(s) reached the "
                     f"output after their playout moment ({r.metrics.get('sender_late_ms')}"
                     f" ms in all): gaps there are the TTS/agent's (or a busy host's), "
                     f"not the link's.")
    stall = r.metrics.get("sender_gap_max_ms")
    if isinstance(stall, float) and stall > SENDER_STALL_MS:
        lines.append(f"\n> the agent's speaker paused {stall:.0f} ms between two frames of "
                     f"the reply (its event loop was held up): an underrun made before "
                     f"the link.")
    lines += ["", "| gate | value | threshold | status |", "|---|---|---|---|",
              *[_gate_row(g) for g in r.gates], ""]
    for t in r.capture.transcript:
        cut = " (interrupted)" if t.get("interrupted") else ""
        lines.append(f"- {t.get('role')}: {str(t.get('text', ''))[:160]!r}{cut}")
    if r.capture.transcript:
        lines.append("")
    figs = " · ".join(f"{k}={_fmt(r.metrics.get(k))}" for k in _KEYS_MD
                      if r.metrics.get(k) is not None)
    lines += [f"figures: {figs}", ""]
    if r.post is not None:
        lines += [f"![{r.case.id}](cases/{r.case.id}/reply.png)", ""]
    return lines


SENDER_STALL_MS = 40.0  # a pause between two sent 20 ms frames the listener hears
_TIMING = ("audible_dropouts", "max_gap", "inter_arrival_p95", "inter_arrival_max")
_SENDER_FIX = ("the TTS (or the agent's loop) ran behind real time - check tts_rtf and the "
               "host's load first; a playout pre-buffer of one packet in the agent hides "
               "start-up jitter.")


def _fixes(results: list[CaseResult], suite_gates: list[GateResult]) -> list[str]:
    out: list[str] = []
    seen: dict[str, list[str]] = {}
    fix_text: dict[str, str] = {}
    for g in suite_gates:
        if g.status == FAIL:
            seen.setdefault(g.name, []).append("suite")
            fix_text[g.name] = g.fix
    for r in results:
        if r.case.priority == "P1":
            missed = [n for n in r.case.expect_fail if n not in r.detected]
            if missed:
                out.append(f"- **{r.case.id}**: the {r.case.fault.kind if r.case.fault else ''}"
                           f" fault was NOT detected by {', '.join(missed)}: the gate cannot "
                           f"fail as configured; check its threshold.")
            continue
        late = r.metrics.get("sender_late_frames")
        stall = r.metrics.get("sender_gap_max_ms")  # the speaker itself paused (its loop)
        late_sender = (isinstance(late, float) and late > 0) or (
            isinstance(stall, float) and stall > SENDER_STALL_MS)
        for g in r.failed():
            sender = late_sender and g.name in _TIMING
            seen.setdefault(g.name, []).append(r.case.id + (" (sender late)" if sender else ""))
            fix_text[g.name] = g.fix
    for name, where in seen.items():
        out.append(f"- **{name}** FAIL ({', '.join(where)}): {fix_text[name]}")
        if any(w.endswith("(sender late)") for w in where):
            out.append(f"  - where marked (sender late), the frames reached the output after "
                       f"their playout time: {_SENDER_FIX}")
    return out


def write_report(run_dir: Path, report: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    j, m = run_dir / "report.json", run_dir / "report.md"
    j.write_text(json.dumps(report, indent=2, default=float), encoding="utf-8")
    m.write_text(markdown, encoding="utf-8")
    return j, m
