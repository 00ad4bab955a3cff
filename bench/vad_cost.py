"""What the agent's Silero VAD costs a conversation on this host's CPU: the plugin's streams
one at a time (each window its own `session.run` in the loop's executor) against the batch
(`voice_agent.vad_batch`: the windows due in one call).

N conversations on one event loop, as one agent process holds them, each with the VAD as
the agent has it (`--streams 0`: the session's stream and the ear's view of it, one Silero
stream; `--streams 2`: one each, as before the ear followed), through `TimedVAD`: each
conversation is fed espeak-ng sentences with 1.5 s pauses in 20 ms frames paced in real
time, from its own point of the track and at its own phase in the 20 ms. After a 2 s
warm-up, the process's CPU (every thread) over `--seconds` is divided by N x seconds:
cores per conversation, the same as core-seconds per conversation-second. `none` feeds
the frames to no VAD (the harness alone); the VAD's own cost is the row less that. Also:
the ONNX runs' share (thread CPU inside `session.run`), the mean batch, and the delay from
a window's last frame to its probability reaching the reader (p50 / p95).

    .venv/agent/bin/python -m bench.vad_cost
    .venv/agent/bin/python -m bench.vad_cost --vad batched --n 16,64 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

FRAME = 320  # 20 ms at 16 kHz
WARMUP_S = 2.0
TEXTS = ("What is the weather like today?", "Book a table for two at eight, please.",
         "And what about tomorrow morning?", "I would like to hear some quiet music.")


def track() -> np.ndarray:
    """espeak-ng sentences, each followed by 1.5 s of silence, int16 at 16 kHz."""
    from voice_agent.direct import read_wav_16k

    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(TEXTS):
            path = Path(tmp) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
            parts += [read_wav_16k(path), np.zeros(24000, np.int16)]
    return np.concatenate(parts)


class Counters:
    def __init__(self) -> None:
        self.onnx_cpu = 0.0
        self.batches: list[int] = []
        self.delays: list[float] = []
        self.ends = 0
        self.lock = threading.Lock()

    def time_runs(self, session: Any) -> None:
        """Count the thread CPU inside `session.run` (one intra-op thread: the caller's)."""
        run = session.run

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return run(*args, **kwargs)
            finally:
                with self.lock:
                    self.onnx_cpu += time.thread_time() - t0

        session.run = timed


def make_vad(kind: str, max_wait_ms: float, counters: Counters) -> Any:
    from livekit.plugins import silero
    from voice_agent.settings import AgentSettings
    from voice_agent.speech_end import TimedVAD
    from voice_agent.vad_batch import BatchedVAD

    s = AgentSettings()
    opts = {"min_speech_duration": s.vad_min_speech_ms / 1000,
            "min_silence_duration": s.vad_silence_ms / 1000,
            "activation_threshold": s.vad_activation_threshold, "sample_rate": 16000}
    inner = (silero.VAD if kind == "plain" else BatchedVAD).load(**opts)
    counters.time_runs(inner._onnx_session)
    if isinstance(inner, BatchedVAD):
        inner.batch.max_wait_s = max_wait_ms / 1000
        run = inner.batch.run

        def counted(windows: list[Any]) -> np.ndarray:
            counters.batches.append(len(windows))
            return run(windows)

        inner.batch.run = counted  # type: ignore[method-assign]
    return TimedVAD(inner, lambda _: None)


async def conversation(vad: Any, audio: np.ndarray, start: int, phase_s: float,
                       until: float, streams: int, counters: Counters) -> None:
    from livekit import rtc
    from livekit.agents import vad as lk_vad
    from voice_agent.speech_end import TimedVAD

    loop = asyncio.get_running_loop()
    pushed: list[float] = []
    if vad is None:
        opened: list[Any] = []
    elif streams == 0:  # the agent since the ear follows: the session's stream + its view
        own = TimedVAD(vad.inner, lambda _: None)  # a conversation's own, as build_parts
        opened = [own.stream(), own.follow()]
    else:
        opened = [vad.stream() for _ in range(streams)]

    async def read(stream: Any) -> None:
        async for ev in stream:
            if ev.type == lk_vad.VADEventType.INFERENCE_DONE:
                counters.delays.append(loop.time() - pushed[(ev.samples_index - 1) // FRAME])
            elif ev.type == lk_vad.VADEventType.END_OF_SPEECH:
                counters.ends += 1

    readers = [asyncio.create_task(read(s)) for s in opened]
    await asyncio.sleep(phase_s)
    t0, k = loop.time(), 0
    while loop.time() < until:
        i = (start + k * FRAME) % (len(audio) - FRAME)
        frame = rtc.AudioFrame(audio[i:i + FRAME].tobytes(), 16000, 1, FRAME)
        pushed.append(loop.time())
        for s in opened:
            s.push_frame(frame)
        k += 1
        await asyncio.sleep(max(0.0, t0 + k * FRAME / 16000 - loop.time()))
    for s in opened:
        s.end_input()
    await asyncio.gather(*readers)
    for s in opened:
        await s.aclose()


async def measure(kind: str, n: int, seconds: float, streams: int, max_wait_ms: float,
                  audio: np.ndarray) -> dict[str, Any]:
    counters = Counters()
    vad = None if kind == "none" else make_vad(kind, max_wait_ms, counters)
    loop, rng = asyncio.get_running_loop(), random.Random(n)
    until = loop.time() + WARMUP_S + seconds + 0.05
    calls = [conversation(vad, audio, rng.randrange(len(audio)), rng.uniform(0, 0.02), until,
                          streams, counters) for _ in range(n)]
    running = asyncio.gather(*calls)
    await asyncio.sleep(WARMUP_S)
    counters.onnx_cpu, counters.batches, counters.delays = 0.0, [], []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    onnx, batches, delays = counters.onnx_cpu, list(counters.batches), list(counters.delays)
    await running
    return {"vad": kind, "n": n, "cores": cpu / wall, "per_conv": cpu / wall / n,
            "onnx_per_conv": onnx / wall / n,
            "batch": float(np.mean(batches)) if batches else float("nan"),
            "p50_ms": float(np.percentile(delays, 50)) * 1000 if delays else float("nan"),
            "p95_ms": float(np.percentile(delays, 95)) * 1000 if delays else float("nan"),
            "ends": counters.ends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vad", default="none,plain,batched",
                        help="none (the harness), plain (the plugin), batched (comma-separated)")
    parser.add_argument("--n", default="16,64", help="conversations at once (comma-separated)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, after warm-up")
    parser.add_argument("--streams", type=int, default=0,
                        help="Silero streams a conversation: 0 = the agent's (the session's, "
                        "and the ear's view of it: TimedVAD.follow), 2 = one each (before)")
    parser.add_argument("--max-wait-ms", type=float, default=8.0,
                        help="batched: how long a window waits for the others (MAX_WAIT_S)")
    args = parser.parse_args()

    import onnxruntime as ort
    from voice_agent.quiet_logs import quiet_framework_warnings

    quiet_framework_warnings()  # silero's per-window "slower than realtime", as the agent
    audio = track()
    print(f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"onnxruntime {ort.__version__}, {args.streams} streams a conversation, "
          f"{args.seconds:g} s measured, max wait {args.max_wait_ms:g} ms")
    print(f"{'vad':>8} {'N':>4} {'cores':>6} {'core/conv':>10} {'net':>8} {'onnx':>8} "
          f"{'batch':>6} {'p50 ms':>7} {'p95 ms':>7} {'ends':>5}")
    base: dict[int, float] = {}
    for n in (int(x) for x in args.n.split(",")):
        for kind in args.vad.split(","):
            r = asyncio.run(measure(kind, n, args.seconds, args.streams, args.max_wait_ms, audio))
            if kind == "none":
                base[n] = r["per_conv"]
            net = r["per_conv"] - base.get(n, 0.0)
            print(f"{kind:>8} {n:>4} {r['cores']:6.3f} {r['per_conv']:10.4f} {net:8.4f} "
                  f"{r['onnx_per_conv']:8.4f} {r['batch']:6.1f} {r['p50_ms']:7.1f} "
                  f"{r['p95_ms']:7.1f} {r['ends']:>5}", flush=True)


if __name__ == "__main__":
    main()
