"""--compare: the regression of this run against an earlier one (its report.json).

The earlier run's primary KPI is the baseline of the `kpi_regression` gate (seed 003
16.1: FAIL when EoT -> first audio P95 is more than 30 ms worse). The markdown shows
the suite aggregates side by side and, per case present in both, the figures that
moved and the gates that changed status.

Standalone: `python -m voice_autortc.compare OLD_RUN NEW_RUN` prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .verdict import PRIMARY_KPI

_AGG = (PRIMARY_KPI, "eot_to_first_audio_p50_ms", "agent_eot_to_first_audio_p95_ms",
        "tts_first_to_publish_p95_ms", "llm_ttft_p95_ms", "tts_ttfa_p95_ms",
        "inter_arrival_p95_ms", "p0_valid_rate")
_CASE = ("eot_to_first_audio_ms", "llm_ttft_ms", "tts_ttfa_ms", "max_gap_ms",
         "audible_dropouts", "clipping_ratio", "inter_arrival_p95_ms", "mel_distance_db",
         "hf_ratio_drop_db")
# Lower is better for every figure above except the valid rate.
_HIGHER_IS_BETTER = {"p0_valid_rate"}


def load_report(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / "report.json" if p.is_dir() else p
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--compare: no report.json at {p}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--compare: {p} is not valid JSON: {e}") from None


def baseline_kpi(report: dict[str, Any]) -> float | None:
    v = report.get("aggregates", {}).get(PRIMARY_KPI)
    return float(v) if isinstance(v, int | float) else None


def _delta(old: Any, new: Any, key: str, tol: float) -> tuple[str, bool]:
    if not isinstance(old, int | float) or not isinstance(new, int | float):
        return "n/a", False
    d = new - old
    worse = (d < -tol) if key in _HIGHER_IS_BETTER else (d > tol)
    return f"{d:+.4g}", worse


def compare_markdown(old: dict[str, Any], new: dict[str, Any], tol_ms: float = 30.0) -> str:
    lines = [f"## Compare with run `{old.get('run', {}).get('trace_id', '?')}`", "",
             f"verdict {old.get('verdict')} → {new.get('verdict')}", "",
             "| aggregate | before | now | Δ | |", "|---|---|---|---|---|"]
    oa, na = old.get("aggregates", {}), new.get("aggregates", {})
    for k in _AGG:
        tol = 0.0 if k == "p0_valid_rate" else tol_ms
        d, worse = _delta(oa.get(k), na.get(k), k, tol)
        flag = "⚠ regression" if worse else ""
        lines.append(f"| {k} | {oa.get(k)} | {na.get(k)} | {d} | {flag} |")
    old_cases = {c["case_id"]: c for c in old.get("cases", [])}
    rows = []
    for c in new.get("cases", []):
        o = old_cases.get(c["case_id"])
        if o is None:
            continue
        og = {g["name"]: g["status"] for g in o.get("gates", [])}
        changed = [f"{g['name']} {og[g['name']]}→{g['status']}" for g in c.get("gates", [])
                   if g["name"] in og and og[g["name"]] != g["status"]]
        moved = []
        for k in _CASE:
            tol = tol_ms if k.endswith("_ms") else 0.0
            d, worse = _delta(o["metrics"].get(k), c["metrics"].get(k), k, tol)
            if worse:
                moved.append(f"{k} {d}")
        if changed or moved or o.get("verdict") != c.get("verdict"):
            rows.append(f"| {c['case_id']} | {o.get('verdict')} → {c.get('verdict')} | "
                        f"{'; '.join(changed) or '-'} | {'; '.join(moved) or '-'} |")
    lines += ["", "| case | verdict | gates changed | worse figures |", "|---|---|---|---|"]
    lines += rows or ["| (no case changed) | | | |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voice_autortc.compare",
                                 description="Regression of NEW against OLD (run dirs or "
                                             "report.json files).")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tolerance-ms", type=float, default=30.0,
                    help="latency growth that counts as a regression (default 30)")
    a = ap.parse_args(argv)
    try:
        print(compare_markdown(load_report(a.old), load_report(a.new), a.tolerance_ms))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
