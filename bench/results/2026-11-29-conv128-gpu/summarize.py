"""The conv128 H200 runs' table from their archives (no device needed):

    python3 bench/results/2026-11-29-conv128-gpu/summarize.py   # -> summary.md, summary.json
    python3 bench/results/2026-11-29-conv128-gpu/summarize.py DIR RUN ...  # another folder's
    GPU=H100 python3 bench/results/2026-11-29-conv128-gpu/summarize.py DIR RUN ...  # its card

(a folder of the same runs' archives, one_gpu_<RUN>.tgz, gets its table the same way).

Per run (one_gpu_<run>.tgz) and level: callers admitted, EoT -> first audio on the caller's
clock, the host's busy cores and the agents' (bench/host_load.py, the level's whole run),
the agent's per-turn records (thinker TTFT, TTS first audio, the end-of-turn wait) of the
level's turns, matched by trace id.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"text": "text thinker (random:qwen3-1.7b), Moonshine ear on the CPU",
        "omni": "hearing thinker (random:qwen2.5-omni-7b), AGENT_STT_MODE=audio"}
LEVELS = (1, 16, 64, 128)
GPU = os.environ.get("GPU", "H200")  # the card the runs had (the archives do not say)
TURN = re.compile(r"voice_agent\.turns turn (\{.*\})$")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def load(folder: Path, run: str) -> dict[str, bytes]:
    with tarfile.open(folder / f"one_gpu_{run}.tgz") as t:
        return {Path(m.name).name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def turn_records(files: dict[str, bytes]) -> dict[str, dict]:
    """The agents' per-turn records in a run's logs, by trace id."""
    records = {}
    for name, data in files.items():
        if name.startswith("agent_") and name.endswith(".log"):
            for line in data.decode(errors="replace").splitlines():
                if m := TURN.search(line):
                    r = json.loads(m.group(1))
                    records[r["trace_id"]] = r
    return records


def level_row(files: dict[str, bytes], n: int, records: dict[str, dict]) -> dict:
    c = json.loads(files[f"conv_{n}.json"])["levels"][0]
    h = json.loads(files[f"host_load_{n}.json"])["summary"]
    admitted = c["callers"] - c["refused"]
    mine = [records[t["agent"]["trace_id"]] for t in c["per_turn"]
            if (t.get("agent") or {}).get("trace_id") in records]

    def stage(k: str) -> dict:
        xs = [r[k] for r in mine if r.get(k) is not None]
        return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95)}

    reasons = sorted({d["refusal"]["message"].split(":")[0] for d in c["callers_detail"]
                      if d["status"] == "refused"})
    return {
        "conversations": n, "admitted": admitted, "refused": c["refused"],
        "refused_why": reasons, "turns": c["turns"], "unanswered": c["unanswered"],
        "eot_to_first_audio_ms": c["eot_to_first_audio_ms"],
        "host_busy_cores": h["host_busy"], "agents_cores": h["agent"],
        "agents_cores_per_conversation": round(h["agent"]["mean"] / admitted, 3),
        "ear_cores": h.get("ear", {"mean": 0.0, "max": 0.0}),  # none when nothing transcribes
        "tts_cores": h["tts"], "thinker_cores": h["thinker"],
        "callers_cores": h["callers"],
        "tts_first_audio_ms": c["stages_ms"]["tts_ttfa_ms"],
        "thinker_ttft_ms": c["stages_ms"]["llm_ttft_ms"],
        "eot_wait_ms": stage("eot_wait_ms"), "llm_to_tts_ms": stage("llm_to_tts_ms"),
        "false_cutoffs": f"{c['false_cutoffs']}/{c['paused_turns']}",
        "barge_ins_cleared": f"{c['barge_ins_cleared']}/{c['barge_ins']}",
        "audio_after_clear_max_ms": c["clear_to_silence_ms"]["max"],
        "hole_pct": round(100 * c["hole_fraction"], 3),
        "agent_minus_caller_abs_p95_ms": c["agent_minus_caller_ms"]["abs_p95"],
        "mic_late_ms_max": c["mic_late_ms_max"], "wall_s": c["wall_s"],
    }


def main(folder: Path = HERE, runs: tuple[str, ...] = tuple(RUNS)) -> None:
    out: dict[str, list[dict]] = {}
    lines = ["| thinker | conversations (admitted) | EoT -> first audio p50 / p95 / max ms | "
             "host CPU busy mean / peak (of 16) | agents' cores (per conversation) | "
             "TTS first audio p50 / p95 ms | thinker TTFT p50 / p95 ms | turn-end wait p50 / "
             "p95 ms | unanswered | false cut-offs | reply holes | where |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        files = load(folder, run)
        records = turn_records(files)
        out[run] = [level_row(files, n, records) for n in LEVELS
                    if f"conv_{n}.json" in files]  # the levels the run had
        for r in out[run]:
            e, t, f, w = (r[k] for k in ("eot_to_first_audio_ms", "tts_first_audio_ms",
                                         "thinker_ttft_ms", "eot_wait_ms"))
            lines.append(
                f"| {run} | {r['conversations']} ({r['admitted']}) | **{e['p50']:.0f} / "
                f"{e['p95']:.0f}** / {e['max']:.0f} | {r['host_busy_cores']['mean']} / "
                f"{r['host_busy_cores']['max']} | {r['agents_cores']['mean']} "
                f"({r['agents_cores_per_conversation']}) | {t['p50']:.0f} / {t['p95']:.0f} | "
                f"{f['p50']:.0f} / {f['p95']:.0f} | {w['p50']:.0f} / {w['p95']:.0f} | "
                f"{r['unanswered']}/{r['turns']} | {r['false_cutoffs']} | {r['hole_pct']} % | "
                f"{GPU}, synthetic speech (espeak-ng) |")
    (folder / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 2:
        main(Path(sys.argv[1]), tuple(sys.argv[2:]))
    else:
        main()
