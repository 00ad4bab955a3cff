"""How many speaking streams the engine keeps in real time, learned from its own steps.

Every running utterance needs one engine step per codec frame (80 ms of audio), and one
step advances every running utterance at once. With `b` streams in the batch each gets a
frame every P(b) ms, P being the time from one step to the next at that batch: the
streams stay real time while P(b) < 80 ms. `FramePeriodModel` learns P from the
engine's `StepStats`; admission (`admission.py`) keeps P(speaking + 1) under 80 ms x a
margin.

- **A step's period.** With CUDA graphs a step's audio leaves one iteration after its
  launch (its decoder runs beside the next step), so `step_ms` is ~1.7 periods (0.6B on an
  H100: 42.4 ms `step` at c = 256, RTF 0.307 = 24.6 ms per frame). When the engine runs
  back to back, the time between two steps' stats is the period; when it waited for text
  in between, that time is idle time. So a sample is the smaller of the two: the period
  when steps follow each other, the step's own time otherwise (never below the truth by
  more than the host's work between steps on CPU, where steps do not overlap).
- **Per batch bucket** (1, 2, 4 ... as the engine's CUDA graphs): an EMA of (batch,
  period) pairs, so each bucket is one point at its mean batch. Between points P is
  interpolated linearly; below the first it is the first point's period; a bigger
  batch is never predicted faster than a smaller one (running max over the points).
- **Above the largest measured batch** P grows *in proportion to the batch* from the
  last point: P(n) = P(b) * n / b. A batched step costs no more per row than a smaller
  one (the GPU's cost per row falls with the batch; on CPU it is about flat), so this
  bounds P from above, and the first steps at a larger batch replace the guess. A cold
  server therefore grows in a few rounds of measurement (0.6B on an H100: 3.6 ms at
  batch 1 admits ~15, 6.2 ms at 16 then ~144 ...) instead of admitting everyone at once.
- **Stale points are dropped**: a bucket not stepped for `stale_s` (by the clock of the
  newest step) no longer counts. Admission admits only what the points allow, so a bucket
  measured during an overload (a slow period at batch 4, say) would otherwise hold the
  prediction above the budget at every load that never steps batch 4 again: seen on the
  H100, the 1.7B server rejected 93% of a 30 req/s soak with 2-5 streams running.
- **A baseline from warm-up** (`seed`): the engine times one step of every CUDA-graph
  bucket after capturing them (graphs.py, `step_ms`: the parts back to back, so an
  upper bound of the period). A bucket with no fresh measurement takes its baseline
  point, which never goes stale. Without it a server coming back from idle has only
  its batch-1 point fresh and extrapolates in proportion (0.6B on an H100: 6.2 ms at
  batch 1 puts the 20 ms budget at ~3 streams, while the GPU runs batch 8 in 7.2 ms).
- **Nothing measured yet** (no baseline, no step): `predict_ms` is None; the caller
  decides (admission admits).

`FrontModel` guards the gRPC front, one Python event loop that writes every stream's
frames: its thread's CPU share of a core, measured over 1 s windows, per open stream
(`share(n)` = that x n). Per open stream, because the loop's work follows the calls: it
writes each stream's frames (paced: in real time, for as long as the audio plays, long
after the engine made them), reads its text, and opens and closes it. An earlier model,
messages the engine makes x CPU per message written, assumed every speaking stream takes
a frame a step and all loop CPU is writes: on the H100 (0.6B, paced, 30 req/s) it
predicted 4-6x the loop's real share and refused 40 % of the calls by the front rule at
~120 open streams with the loop at ~0.2 of a core.

Thread-safe: `observe` runs on the engine thread, `predict_ms` on the event loop. This
module knows nothing about gRPC or sessions.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any


def bucket_of(batch: int) -> int:
    """The power of two at or above `batch` (the engine's graph buckets)."""
    return 1 << max(0, batch - 1).bit_length()


class FramePeriodModel:
    def __init__(self, alpha: float = 0.2, stale_s: float = 10.0) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha, self.stale_s = alpha, stale_s
        self._lock = threading.Lock()
        # bucket -> (mean batch, ms, when last stepped)
        self._buckets: dict[int, tuple[float, float, float]] = {}
        self._baseline: dict[int, tuple[float, float]] = {}  # bucket -> (batch, ms)
        self._points: list[tuple[float, float]] = []  # sorted by batch, for predict
        self._last_at: float | None = None

    def observe(self, stats: Any, now: float | None = None) -> None:
        """One `StepStats` (batch_size, step_ms), as the engine hands it over."""
        self.observe_step(stats.batch_size, stats.step_ms, now)

    def observe_step(self, batch: int, step_ms: float, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        with self._lock:
            sample = step_ms
            if self._last_at is not None:
                sample = min(sample, (now - self._last_at) * 1e3)
            self._last_at = now
            if batch < 1 or sample <= 0.0:
                return
            key = bucket_of(batch)
            old = self._buckets.get(key)
            if old is None:
                new = (float(batch), sample, now)
            else:
                a = self.alpha
                new = (old[0] + a * (batch - old[0]), old[1] + a * (sample - old[1]), now)
            self._buckets[key] = new
            for k in [k for k, v in self._buckets.items() if now - v[2] > self.stale_s]:
                del self._buckets[k]
            self._rebuild()

    def seed(self, step_ms: dict[int, float]) -> None:
        """Baseline period per batch bucket ({batch: ms}, the engine's warm-up timing):
        used where no fresh measurement is; never stale."""
        with self._lock:
            self._baseline = {bucket_of(b): (float(b), ms) for b, ms in step_ms.items()
                              if b >= 1 and ms > 0}
            self._rebuild()

    def _rebuild(self) -> None:
        """The points predict reads: fresh buckets, else baselines (under the lock)."""
        merged = dict(self._baseline)
        merged.update({k: (b, p) for k, (b, p, _) in self._buckets.items()})
        # A bigger batch never runs faster: the running max keeps P non-decreasing
        # through noise (and max_streams' bisection valid).
        points, top = [], 0.0
        for b, p in sorted(merged.values()):
            top = max(top, p)
            points.append((b, top))
        self._points = points

    def predict_ms(self, n: int) -> float | None:
        """The frame period with `n` streams in the batch, or None before any step."""
        points = self._points  # replaced whole under the lock, read without it
        if not points:
            return None
        if n <= points[0][0]:
            return points[0][1]
        for (b0, p0), (b1, p1) in itertools.pairwise(points):
            if n <= b1:
                return p0 + (p1 - p0) * (n - b0) / (b1 - b0)
        b, p = points[-1]
        return p * n / b

    def max_streams(self, budget_ms: float, limit: int) -> int:
        """The largest n <= limit with P(n) <= budget_ms (limit if nothing is measured)."""
        if self.predict_ms(1) is None:
            return limit
        lo, hi = 0, limit  # P is non-decreasing in n: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            p = self.predict_ms(mid)
            if p is not None and p <= budget_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def points(self) -> list[tuple[float, float]]:
        """(mean batch, period ms) per measured bucket, by batch."""
        return list(self._points)


class FrontModel:
    """The event loop's CPU share of one core per open stream, learned while it serves;
    `share(n)` predicts its share at n open streams. Loop thread only."""

    def __init__(self, open_streams: Callable[[], int], window_s: float = 1.0,
                 alpha: float = 0.3, min_streams: float = 8.0, stale_s: float = 10.0) -> None:
        self._open = open_streams
        self.window_s, self.alpha, self.min_streams = window_s, alpha, min_streams
        self.stale_s = stale_s
        self.per_stream: float | None = None  # CPU share of one core per open stream
        self._mark: tuple[float, float, int] | None = None  # (when, thread CPU, open)
        self._quiet = 0  # windows in a row with too few streams to measure

    def sample(self, now: float | None = None, cpu_s: float | None = None) -> None:
        """Closes a window once `window_s` has passed (called at admissions and scrapes,
        on the loop's thread: `cpu_s` is that thread's CPU time)."""
        now = time.monotonic() if now is None else now
        cpu_s = time.thread_time() if cpu_s is None else cpu_s
        n = self._open()
        if self._mark is None:
            self._mark = (now, cpu_s, n)
            return
        t0, cpu0, n0 = self._mark
        if now - t0 < self.window_s:
            return
        self._mark = (now, cpu_s, n)
        if now - t0 > self.stale_s:
            # Nothing sampled for a while (no admissions: a pause): this window mixes the
            # pause with whatever came after, and what was learned before it is old. Seen
            # on the H100 (bench/openloop.py): a cost kept over a 15 s pause refused 27 of
            # the first 29 calls of the next run at 10 req/s.
            self.per_stream = None
            self._quiet = 0
            return
        streams = (n0 + n) / 2
        if streams < self.min_streams:
            # Too few streams to tell their cost from the loop's idle work. After a few
            # such windows forget it (unknown: admission admits and measures again): a
            # cost learned under overload must not keep refusing a quiet server.
            self._quiet += 1
            if self._quiet >= 3:
                self.per_stream = None
            return
        self._quiet = 0
        per = (cpu_s - cpu0) / (now - t0) / streams
        self.per_stream = per if self.per_stream is None else \
            self.per_stream + self.alpha * (per - self.per_stream)

    def share(self, n: int) -> float | None:
        """The loop's CPU share of one core at n open streams (None: not measured)."""
        return None if self.per_stream is None else self.per_stream * n
