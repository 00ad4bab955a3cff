"""The first reply of an agent process does not stall the event loop: the transcript
synchronizer's lazy state (the hyphenator's pattern tree, numpy.fft) is built at start-up
by `warmup.warm_transcript_timing` (worker prewarm, --direct, serve-direct,
DirectSession.start). Each probe runs in a fresh process, where that state is cold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("transcript_stall_probe.py")


def probe(*args: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_warmed_process_does_not_stall_in_its_first_reply() -> None:
    # Measured (idle 2-core VM): cold 16-100 ms of loop CPU in one go, warm 2-3 ms (the
    # speaking-rate detector's STFT every 100 ms); on a slower 2-core machine (2026-11-25)
    # cold 48 ms, warm 7-9 ms. Under a loaded CI (2026-11-28) one pair read warm 11.7
    # against cold 29.3: a preempted tick's CPU lands in one gap. So the bound is relative
    # and the best of up to three pairs counts; a process that is not warmed fails all three.
    colds: list[dict[str, float]] = []
    warms: list[dict[str, float]] = []
    for _ in range(3):
        colds.append(probe())
        warms.append(probe("--warm"))
        cold = min(c["max_cpu_ms"] for c in colds)
        warm = min(w["max_cpu_ms"] for w in warms)
        if warm < cold / 3 and cold > warm + 6.0:
            return
    assert warm < cold / 3, f"warm: {warms}, cold: {colds}"
    assert cold > warm + 6.0, (
        f"the probe no longer sees the cold stall (cold {colds}, warm {warms}): has the "
        "framework changed what it builds lazily?")


def test_warming_is_once_per_process() -> None:
    from voice_agent.warmup import warm_transcript_timing

    first = warm_transcript_timing()
    assert warm_transcript_timing() == first  # cached: no second build
