"""Moonshine (the agent's default offline ear) under concurrency on one host.

Each process loads Moonshine tiny-en as the agent's recogniser worker does
(`voice_agent.sphinx._moonshine`) and transcribes the same utterance; `--procs` processes
at once, `--reps` rounds. Prints the threads each process holds (ONNX Runtime sizes its
pools by the host's cores and the wheel exposes no thread setting) and the latency per
transcription, alone and together, with and without pinning each process to one CPU.

    python -m bench.moon_threads --wav .loopwavs/turn1.wav --procs 1,16
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/agent/src"))


def worker(wav: str, pin: bool, index: int, go: mp.Queue, out: mp.Queue) -> None:
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})
    from voice_agent.sphinx import _moonshine

    transcribe = _moonshine()
    with wave.open(wav) as w:
        pcm = w.readframes(w.getnframes())
    transcribe(pcm)  # warm-up
    out.put(len(os.listdir("/proc/self/task")))
    while go.get() is not None:
        t0 = time.perf_counter()
        transcribe(pcm)
        out.put((time.perf_counter() - t0) * 1e3)


def run(wav: str, procs: int, pin: bool, reps: int) -> str:
    out: mp.Queue = mp.Queue()
    gos = [mp.Queue() for _ in range(procs)]
    ps = [mp.Process(target=worker, args=(wav, pin, i, gos[i], out)) for i in range(procs)]
    for p in ps:
        p.start()
    threads = [out.get() for _ in ps]
    times = []
    for _ in range(reps):
        for go in gos:
            go.put(1)
        times += [out.get() for _ in ps]
    for go in gos:
        go.put(None)
    for p in ps:
        p.join()
    times.sort()
    return (f"pin={pin} procs={procs} threads/proc={max(threads)} ms p50 "
            f"{times[len(times) // 2]:.0f} p95 {times[int(len(times) * 0.95)]:.0f} "
            f"max {times[-1]:.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wav", default=".loopwavs/turn1.wav", help="16-bit mono speech")
    p.add_argument("--procs", default="1,16", help="concurrent processes, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="rounds per level")
    args = p.parse_args()
    print("cpus", os.cpu_count(), flush=True)
    for pin in (False, True):
        for n in (int(x) for x in args.procs.split(",")):
            print(run(args.wav, n, pin, args.reps), flush=True)


if __name__ == "__main__":
    main()
