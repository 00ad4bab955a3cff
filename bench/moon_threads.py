"""Moonshine (the agent's default offline ear) under concurrency on one host.

Two engines over the same model files (Moonshine tiny-en in `moonshine-voice==0.1.0`):
- `lib`: the wheel's C++ library (`Transcriber.transcribe_without_streaming`), as the
  agent ran it before: its bundled ONNX Runtime sizes its pools by the host's cores and
  offers no thread setting;
- `ours`: our own onnxruntime sessions (`voice_agent.moonshine`), as the agent's worker
  runs them now: `--threads` intra-op threads (`AGENT_STT_THREADS`), no spinning, and
  OpenBLAS held to one thread (the worker's environment).

Each process loads one engine and transcribes the same utterance (trimmed as the worker
trims it); `--procs` processes at once, `--reps` rounds. Prints the threads each process
holds and the latency per transcription, alone and together, with and without pinning
each process to one CPU, and each engine's transcript.

    python -m bench.moon_threads --wav .loopwavs/turn1.wav --procs 1,16
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import wave
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/agent/src"))

ENGINES = ("lib", "ours")
# the agent's worker environment (voice_agent.sphinx._ONE_THREAD)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def library() -> Callable[[bytes], str]:
    """The agent's old recogniser: the wheel's library over the trimmed utterance."""
    import numpy as np
    from moonshine_voice.moonshine_api import ModelArch
    from moonshine_voice.transcriber import Transcriber
    from voice_agent.moonshine import model_dir
    from voice_agent.sphinx import _trim_silence

    tr = Transcriber(str(model_dir()), ModelArch.TINY)

    def transcribe(pcm: bytes) -> str:
        audio = _trim_silence(np.frombuffer(pcm, np.int16)).astype(np.float32) / 32768.0
        out = tr.transcribe_without_streaming(audio.tolist(), 16000)
        return " ".join(line.text.strip() for line in out.lines).strip()

    return transcribe


def worker(engine: str, threads: int, wav: str, pin: bool, index: int, go: mp.Queue,
           out: mp.Queue) -> None:
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})
    if engine == "ours":
        os.environ.update(ONE_THREAD)  # before numpy comes in
        from voice_agent.sphinx import _moonshine

        hear = _moonshine(threads)

        def transcribe(pcm: bytes) -> str:
            return hear(pcm).text
    else:
        transcribe = library()
    with wave.open(wav) as w:
        pcm = w.readframes(w.getnframes())
    text = transcribe(pcm)  # warm-up
    out.put((len(os.listdir("/proc/self/task")), text))
    while go.get() is not None:
        t0 = time.perf_counter()
        transcribe(pcm)
        out.put((time.perf_counter() - t0) * 1e3)


def run(engine: str, threads: int, wav: str, procs: int, pin: bool, reps: int) -> str:
    ctx = mp.get_context("spawn")  # a fresh interpreter each, as the agent's workers
    out: mp.Queue = ctx.Queue()
    gos = [ctx.Queue() for _ in range(procs)]
    ps = [ctx.Process(target=worker, args=(engine, threads, wav, pin, i, gos[i], out))
          for i in range(procs)]
    for p in ps:
        p.start()
    ready = [out.get() for _ in ps]
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
    return (f"{engine:4} pin={pin!s:5} procs={procs} threads/proc={max(n for n, _ in ready)} "
            f"ms p50 {times[len(times) // 2]:.0f} p95 {times[int(len(times) * 0.95)]:.0f} "
            f"max {times[-1]:.0f}  {ready[0][1]!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wav", default=".loopwavs/turn1.wav", help="16 kHz 16-bit mono speech")
    p.add_argument("--procs", default="1,16", help="concurrent processes, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="rounds per level")
    p.add_argument("--engines", default=",".join(ENGINES), help="lib, ours, or both")
    p.add_argument("--threads", type=int, default=1, help="ours: AGENT_STT_THREADS")
    p.add_argument("--pin", default="no,yes", help="pin each process to one CPU: no, yes")
    args = p.parse_args()
    with wave.open(args.wav) as w:
        if (w.getframerate(), w.getsampwidth(), w.getnchannels()) != (16000, 2, 1):
            p.error(f"{args.wav}: need 16 kHz 16-bit mono")
    print("cpus", os.cpu_count(), flush=True)
    for pin in (x == "yes" for x in args.pin.split(",")):
        for n in (int(x) for x in args.procs.split(",")):
            for engine in args.engines.split(","):
                print(run(engine, args.threads, args.wav, n, pin, args.reps), flush=True)


if __name__ == "__main__":
    main()
