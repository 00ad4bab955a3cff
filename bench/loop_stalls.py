"""What an event loop is doing when it stalls: a watchdog thread samples the loop thread's
Python stack while the loop's heartbeat is late, and garbage collections are timed apart.

cProfile says where CPU goes, not what holds the loop for 80 ms once a second; this does.
Built on the loop's thread (it records that thread's id):

    stalls = LoopStalls(asyncio.get_running_loop(), stall_ms=20)
    ...
    print(stalls.report())  # top stacks by samples, GC pauses by generation
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections import Counter


class LoopStalls:
    def __init__(self, loop: asyncio.AbstractEventLoop, stall_ms: float = 20.0,
                 sample_ms: float = 2.0, depth: int = 8) -> None:
        self.loop, self.depth = loop, depth
        self.stall_s, self.sample_s = stall_ms / 1e3, sample_ms / 1e3
        self.thread = threading.get_ident()
        self.beat = time.perf_counter()
        self.stacks: Counter[str] = Counter()
        self.samples = 0
        self.gc_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._gc_t0: float | None = None
        self._gc_gen = -1
        self._stop = threading.Event()
        gc.callbacks.append(self._gc)
        loop.call_soon(self._tick)
        threading.Thread(target=self._watch, name="loop-stalls", daemon=True).start()

    def clear(self) -> None:
        self.stacks.clear()
        self.samples = 0
        for v in self.gc_ms.values():
            v.clear()

    def stop(self) -> None:
        self._stop.set()
        gc.callbacks.remove(self._gc)

    def _tick(self) -> None:
        self.beat = time.perf_counter()
        if not self._stop.is_set():
            self.loop.call_later(0.002, self._tick)

    def _gc(self, phase: str, info: dict) -> None:
        if threading.get_ident() != self.thread:
            return
        if phase == "start":
            self._gc_t0, self._gc_gen = time.perf_counter(), info["generation"]
        elif self._gc_t0 is not None:
            self.gc_ms[info["generation"]].append((time.perf_counter() - self._gc_t0) * 1e3)
            self._gc_t0 = None

    def _watch(self) -> None:
        while not self._stop.wait(self.sample_s):
            if time.perf_counter() - self.beat < self.stall_s:
                continue
            self.samples += 1
            if self._gc_t0 is not None:
                self.stacks[f"<gc generation {self._gc_gen}>"] += 1
                continue
            frame = sys._current_frames().get(self.thread)
            if frame is None:
                self.stacks["<no Python frame: the loop's own C code>"] += 1
                continue
            lines = traceback.extract_stack(frame)[-self.depth:]
            self.stacks[" <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}"
                                    for f in reversed(lines))] += 1

    def report(self, top: int = 8) -> dict:
        return {
            "stall_samples": self.samples, "sample_ms": self.sample_s * 1e3,
            "top_stacks": [(n, s) for s, n in self.stacks.most_common(top)],
            "gc": {g: {"n": len(v), "total_ms": round(sum(v), 1),
                       "max_ms": round(max(v, default=0.0), 1)}
                   for g, v in self.gc_ms.items()},
        }
