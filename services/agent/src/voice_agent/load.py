"""Is this process keeping its conversations in real time? (the admission's question)

Everything a conversation does runs on an event loop: the mic frames it reads, the VAD's
results, the reply's 20 ms ticks. A loop with more work than time runs every callback
late; the paced outputs then send their frames late (holes in every reply) and the VAD
decides late. Two measures of that lateness, per process:

- the loop's lag: a sampler sleeps SAMPLE_S and records how much later than asked it
  woke (`agent_loop_lag_seconds`), on every loop `watch()` runs on (the HTTP server's,
  which carries /v1/talk; each LiveKit job's);
- the paced speakers' ticks (audio_io.PacedOutput): how late each 20 ms tick fired
  after its slot (`tick_late`).

`LoadMonitor.lag_s()` is the 95th percentile of both over the last WINDOW_S; the
process is overloaded when it exceeds AGENT_ADMIT_MAX_LAG_MS (more than one reply frame
in twenty left more than that late: a hole for a client that buffers less), and /v1/talk
then refuses new conversations (talk/hub.py) while those under way go on.

Why these numbers (bench/conversations.py against the tiny TTS and thinker, all on 2
cores): the samples late by over 40 ms were 0.2 / 2.1 / 5.9 / 8 % with 1 / 2 / 3 / 4
conversations (the loop stalls 0.1-0.6 s now and then, more often with more callers);
judged this way the process was overloaded 0 / 5 / 60 / 89 % of the time, and the end of
turn -> first audio p50 went 675 / 634 / 1,101 / 1,176 ms. A 3 s window or the 90th
percentile also refused the call after a start (a conversation's start stalls the loop
~0.1-0.3 s: with the window not yet full of ticks, that alone was a tenth of it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from prometheus_client import Histogram

from .metrics import REGISTRY

SAMPLE_S = 0.05
WINDOW_S = 10.0
QUANTILE = 0.95
MIN_SAMPLES = 10  # fewer in the window (a process just started): not judged

LOOP_LAG = Histogram(
    "agent_loop_lag_seconds", "How late the event loop ran a timer (sampled every 50 ms): "
    "a loop with more work than time delays every conversation on it",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56),
    registry=REGISTRY,
)


class LoadMonitor:
    """Lateness samples of the last `window_s` (from any thread) and their judgement."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()  # (perf time, lateness s)
        self._lock = threading.Lock()
        self._watched: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    def record(self, late_s: float, at: float | None = None) -> None:
        at = time.perf_counter() if at is None else at
        with self._lock:
            self._samples.append((at, max(0.0, late_s)))
            while self._samples and self._samples[0][0] < at - self.window_s:
                self._samples.popleft()

    def tick_late(self, late_s: float) -> None:
        """A paced output's tick fired `late_s` after its slot."""
        self.record(late_s)

    def lag_s(self, now: float | None = None) -> float:
        """The window's QUANTILE of lateness (0 with too few samples to judge)."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            lags = sorted(late for at, late in self._samples if at >= now - self.window_s)
        if len(lags) < MIN_SAMPLES:
            return 0.0
        return lags[min(len(lags) - 1, int(QUANTILE * len(lags)))]

    def overloaded(self, limit_ms: int, now: float | None = None) -> bool:
        """Over the limit (0: never)."""
        return limit_ms > 0 and self.lag_s(now) * 1000.0 > limit_ms

    def watch(self) -> asyncio.Task[None]:
        """Sample the running loop's lag until it closes (once per loop)."""
        loop = asyncio.get_running_loop()
        task = self._watched.get(loop)
        if task is None or task.done():
            task = self._watched[loop] = loop.create_task(self._sample(), name="loop-lag")
            task.add_done_callback(lambda _: self._watched.pop(loop, None))
        return task

    async def _sample(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(SAMPLE_S)
            late = max(0.0, time.perf_counter() - t - SAMPLE_S)
            LOOP_LAG.observe(late)
            self.record(late)


MONITOR = LoadMonitor()  # the process's
