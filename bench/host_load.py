"""Where a host's CPU goes during a load: every process sampled once a second, grouped by
what it is (the TTS server, the thinker, agent processes, their recogniser workers, the
load generator), until SIGTERM; then one JSON summary (mean / max cores per group, the
host's busy cores, load average) and the per-second rows.

  python -m bench.host_load --out host_load.json &   ...   kill %1

Needs psutil (on the GPU host's image).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from pathlib import Path

import psutil

# the first pattern found in a process's command line names its group
GROUPS = (("voice_tts.server", "tts"), ("voice_llm.server", "thinker"),
          ("voice_agent.sphinx", "ear"), ("voice_agent", "agent"),
          ("bench.conversations", "callers"))


def group_of(cmdline: list[str]) -> str | None:
    line = " ".join(cmdline)
    return next((g for pat, g in GROUPS if pat in line), None)


def sample(procs: dict[int, psutil.Process]) -> dict[str, float]:
    """Cores used per group since the last call (cpu_percent / 100)."""
    seen: dict[str, float] = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        g = group_of(p.info["cmdline"] or [])
        if g is None:
            continue
        proc = procs.setdefault(p.pid, p)
        try:
            seen[g] = seen.get(g, 0.0) + proc.cpu_percent(None) / 100.0
        except psutil.Error:
            procs.pop(p.pid, None)
    seen["host_busy"] = psutil.cpu_percent(None) / 100.0 * psutil.cpu_count()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    procs: dict[int, psutil.Process] = {}
    sample(procs)  # cpu_percent's first call only starts the count
    rows = []
    t0 = time.monotonic()
    while not stop:
        time.sleep(args.interval)
        row = {k: round(v, 2) for k, v in sample(procs).items()}
        row["t"] = round(time.monotonic() - t0, 1)
        row["load1"] = round(psutil.getloadavg()[0], 2)
        rows.append(row)
    keys = sorted({k for r in rows for k in r} - {"t"})
    summary = {k: {"mean": round(statistics.fmean(v), 2), "max": max(v)}
               for k in keys if (v := [r.get(k, 0.0) for r in rows])}
    Path(args.out).write_text(json.dumps({"cores": psutil.cpu_count(), "summary": summary,
                                          "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
