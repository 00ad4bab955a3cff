"""Turn-taking as the field measures it: false cut-offs and end of turn -> first audio, per
end-of-turn setting of the agent, through AutoRTC on the real agent.

The case set (`voice_autortc/cases/turns.json`): turns with a pause inside them (300,
500, 700, 900 ms of silence mid-sentence, espeak-ng speech) and finished turns. Each
setting runs the whole set once in a fresh `run_suite --spawn-backends` (real TTS and
thinker servers, tiny models; the agent's offline ear hears the speech), the agent
configured by the setting's `AGENT_*` variables:

- a **false cut-off**: the agent was audible before the user's last word (AutoRTC's
  `early_reply_ms` > 0) on a turn with a pause inside;
- **end of turn -> first audio**: the user's last speech sample -> the agent's first
  audible reply frame at the listener, on the turns where the agent waited.

The operating point is the fastest setting with at most `--max-false-cutoffs` of the
paused turns cut off. Run it with AutoRTC's venv, from the repository root:

  .venv/autortc/bin/python -m bench.turns --out turns.json            # every setting
  .venv/autortc/bin/python -m bench.turns --settings vad-0.3,model --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import pct

# name -> the agent's env. The VAD ends speech after AGENT_VAD_SILENCE_MS of silence; the
# turn ends AGENT_MIN_ENDPOINTING_DELAY_S later ("vad"), or, with the framework's audio
# end-of-turn model ("model", livekit-local-inference's v1-mini), then only if the model
# finds the end likely, else up to AGENT_MAX_ENDPOINTING_DELAY_S; "text" the same with the
# transcript's last word (voice_agent/turn_words.py).
SETTINGS: dict[str, dict[str, str]] = {
    "vad-0.3": {"AGENT_TURN_DETECTION": "vad", "AGENT_MIN_ENDPOINTING_DELAY_S": "0.3"},
    "vad-0.6": {"AGENT_TURN_DETECTION": "vad", "AGENT_MIN_ENDPOINTING_DELAY_S": "0.6"},
    "vad-0.9": {"AGENT_TURN_DETECTION": "vad", "AGENT_MIN_ENDPOINTING_DELAY_S": "0.9"},
    "vad-1.2": {"AGENT_TURN_DETECTION": "vad", "AGENT_MIN_ENDPOINTING_DELAY_S": "1.2"},
    "text": {"AGENT_TURN_DETECTION": "text", "AGENT_MIN_ENDPOINTING_DELAY_S": "0.3"},
    "model": {"AGENT_TURN_DETECTION": "model", "AGENT_VAD_SILENCE_MS": "250",
              "AGENT_MIN_ENDPOINTING_DELAY_S": "0.3"},
}
CASES = (Path(__file__).resolve().parent.parent / "services" / "autortc" / "src"
         / "voice_autortc" / "cases" / "turns.json")


def run_setting(name: str, env: dict[str, str], out: Path, run_id: str) -> list[dict[str, Any]]:
    """One AutoRTC run of the case set with the agent configured by `env`: its cases."""
    cmd = [sys.executable, "-m", "voice_autortc.run_suite", "--transport", "direct",
           "--spawn-backends", "--cases", str(CASES), "--output-root", str(out),
           "--run-id", run_id, "--no-progress", "--retries", "0"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **env})
    report = out / run_id / "report.json"
    if proc.returncode not in (0, 1) or not report.exists():
        raise SystemExit(f"turns: {name}: run_suite exited {proc.returncode}:\n"
                         f"{proc.stderr[-3000:]}")
    cases = json.loads(report.read_text())["cases"]
    print(f"turns: {name}: {len(cases)} cases in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return cases


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """False cut-offs on the paused turns (by pause length), end of turn -> first audio
    on the turns where the agent waited."""
    paused = [c for c in cases if c["case_id"].startswith("pause_")]
    measured = [c for c in paused if c["metrics"].get("early_reply_ms") is not None]
    cut = [c for c in measured if c["metrics"]["early_reply_ms"] > 0]
    by_pause: dict[str, list[int]] = {}
    for c in measured:
        counts = by_pause.setdefault(c["case_id"].split("_")[1], [0, 0])
        counts[0] += c in cut
        counts[1] += 1
    waited = [c["metrics"]["eot_to_first_audio_ms"] for c in cases
              if c["metrics"].get("eot_to_first_audio_ms") is not None
              and not (c["metrics"].get("early_reply_ms") or 0) > 0]
    finished = [c["metrics"]["eot_to_first_audio_ms"] for c in cases
                if c["case_id"].startswith("finished_")
                and c["metrics"].get("eot_to_first_audio_ms") is not None]
    return {
        "paused_turns": len(measured), "false_cutoffs": len(cut),
        "false_cutoff_rate": round(len(cut) / len(measured), 4) if measured else None,
        "false_cutoffs_by_pause_ms": {k: f"{v[0]}/{v[1]}" for k, v in sorted(
            by_pause.items(), key=lambda kv: int(kv[0]))},
        "eot_to_first_audio_ms": {"n": len(waited), "p50": pct(waited, 50),
                                  "p95": pct(waited, 95)},
        "finished_eot_to_first_audio_ms": {"n": len(finished), "p50": pct(finished, 50),
                                           "p95": pct(finished, 95)},
        "stt_wer_mean": round(statistics.mean(
            c["metrics"]["stt_wer"] for c in cases if c["metrics"].get("stt_wer") is not None
        ), 3) if any(c["metrics"].get("stt_wer") is not None for c in cases) else None,
        "no_reply": sum(1 for c in cases if c["capture_status"] != "OK"),
    }


def operating_point(rows: dict[str, dict[str, Any]], max_rate: float) -> str | None:
    """The setting with the lowest end of turn -> first audio p50 among those with at most
    `max_rate` false cut-offs."""
    ok = [(r["eot_to_first_audio_ms"]["p50"], name) for name, r in rows.items()
          if r["false_cutoff_rate"] is not None and r["false_cutoff_rate"] <= max_rate
          and r["eot_to_first_audio_ms"]["p50"] is not None]
    return min(ok)[1] if ok else None


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| setting | false cut-offs | by pause (ms) | EoT -> first audio p50 / p95 ms "
             "(turns waited) | finished turns p50 ms | WER |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        e, f = r["eot_to_first_audio_ms"], r["finished_eot_to_first_audio_ms"]
        pauses = ", ".join(f"{k}: {v}" for k, v in r["false_cutoffs_by_pause_ms"].items())
        lines.append(f"| {name} | {r['false_cutoffs']}/{r['paused_turns']} | {pauses} | "
                     f"{e['p50']} / {e['p95']} ({e['n']}) | {f['p50']} | {r['stt_wer_mean']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", default=",".join(SETTINGS),
                   help=f"comma-separated, of: {', '.join(SETTINGS)}")
    p.add_argument("--repeat", type=int, default=1, help="runs of the case set per setting")
    p.add_argument("--max-false-cutoffs", type=float, default=0.05,
                   help="the operating point's bound on the false cut-off rate")
    p.add_argument("--output-root", type=Path, help="AutoRTC's run directories (default: a "
                   "temporary directory)")
    p.add_argument("--out", help="write the results (JSON) here")
    a = p.parse_args(argv)
    names = a.settings.split(",")
    if unknown := [n for n in names if n not in SETTINGS]:
        p.error(f"unknown setting(s) {unknown}; known: {list(SETTINGS)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = a.output_root or Path(tmp)
        rows = {}
        for name in names:
            cases = [c for i in range(a.repeat)
                     for c in run_setting(name, SETTINGS[name], out, f"turns-{name}-{i}")]
            rows[name] = summarize(cases)
            print(f"turns: {name}: {json.dumps(rows[name])}", file=sys.stderr)
    best = operating_point(rows, a.max_false_cutoffs)
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "repeat": a.repeat,
              "settings": {n: SETTINGS[n] for n in names}, "rows": rows,
              "operating_point": best, "max_false_cutoff_rate": a.max_false_cutoffs}
    print(table(rows))
    print(f"operating point (<= {a.max_false_cutoffs:.0%} false cut-offs, lowest p50): {best}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
