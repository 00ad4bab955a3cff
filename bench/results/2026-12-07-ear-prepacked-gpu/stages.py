"""Where a turn's time went, per run and level, from the archives (no device needed):

    python3 bench/results/2026-12-07-ear-prepacked-gpu/stages.py DIR RUN ...

The agents' per-turn records (`voice_agent.turns turn {...}`) of each level's turns
(matched by trace id to the callers' JSON), split by whether the reply had started on the
ear's early pass (the preflight: no thinker TTFT of its own in the record): the end-of-turn
wait, the rest (decision -> first audio), and the stages of the rest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-11-29-conv128-gpu"))
from summarize import LEVELS, load, pct, turn_records

STAGES = ("llm_ttft_ms", "llm_to_tts_ms", "tts_ttfa_ms", "tts_first_to_publish_ms")


def fmt(xs: list[float]) -> str:
    return f"{pct(xs, 0.5):.0f} / {pct(xs, 0.95):.0f}" if xs else "-"


def col(rs: list[dict], k: str) -> list[float]:
    return [r[k] for r in rs if r.get(k) is not None]


def rest(rs: list[dict]) -> list[float]:
    """Decision -> first audio: what the thinker, the bridge and the TTS took after it."""
    return [r["eot_to_first_audio_ms"] - r["eot_wait_ms"] for r in rs]


def main(folder: Path, runs: tuple[str, ...]) -> None:
    print("| run | conversations | turns (on the early pass) | end-of-turn wait p50 / p95 ms,"
          " early / not | decision -> first audio, early / not | thinker TTFT / text -> TTS /"
          " TTS first audio / -> socket (not early) | waits > 1 s |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        files = load(folder, run)
        records = turn_records(files)
        for n in LEVELS:
            if f"conv_{n}.json" not in files:
                continue
            c = json.loads(files[f"conv_{n}.json"])["levels"][0]
            mine = [records[t["agent"]["trace_id"]] for t in c["per_turn"]
                    if (t.get("agent") or {}).get("trace_id") in records]
            mine = [r for r in mine if r.get("eot_wait_ms") is not None
                    and r.get("eot_to_first_audio_ms") is not None]
            early = [r for r in mine if r.get("llm_ttft_ms") is None]
            late = [r for r in mine if r.get("llm_ttft_ms") is not None]
            stages = " / ".join(fmt(col(late, k)) for k in STAGES)
            long = sum(r["eot_wait_ms"] > 1000 for r in mine)
            print(f"| {run} | {n} | {len(mine)} ({len(early)}) | {fmt(col(early, 'eot_wait_ms'))}"
                  f", {fmt(col(late, 'eot_wait_ms'))} | {fmt(rest(early))}, {fmt(rest(late))} |"
                  f" {stages} | {long} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), tuple(sys.argv[2:]))
