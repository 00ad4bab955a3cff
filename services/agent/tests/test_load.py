"""The process's load monitor (load.py): lateness samples, their judgement, the loop
sampler. Deterministic: lateness is fed in, or the loop is blocked for longer than any
limit here."""

from __future__ import annotations

import asyncio
import time

from voice_agent import load
from voice_agent.load import LoadMonitor
from voice_agent.metrics import REGISTRY


def test_the_judgement_is_the_windows_95th_percentile() -> None:
    m = LoadMonitor(window_s=3.0)
    t = 100.0
    for i in range(load.MIN_SAMPLES - 1):
        m.record(0.5, at=t + i * 0.01)
    assert m.lag_s(now=t + 0.1) == 0.0  # too few to judge (a process just started)
    m = LoadMonitor(window_s=3.0)
    for i in range(100):  # 2 s of samples: 4 in 100 late by 200 ms (a conversation starts)
        m.record(0.2 if i % 25 == 0 else 0.002, at=t + i * 0.02)
    assert m.lag_s(now=t + 2.0) == 0.002
    assert not m.overloaded(40, now=t + 2.0)
    for i in range(100, 130):  # then 30 ticks in a row late by 60 ms: replies break up
        m.record(0.06, at=t + i * 0.02)
    assert m.lag_s(now=t + 2.6) == 0.06
    assert m.overloaded(40, now=t + 2.6) and not m.overloaded(0, now=t + 2.6)
    assert not m.overloaded(80, now=t + 2.6)
    # the window moves on: 3 s later the lateness is forgotten
    m.record(0.0, at=t + 6.0)
    assert m.lag_s(now=t + 6.0) == 0.0


async def test_the_sampler_sees_a_blocked_loop() -> None:
    m = LoadMonitor()
    n0 = REGISTRY.get_sample_value("agent_loop_lag_seconds_count") or 0.0
    task = m.watch()
    assert m.watch() is task  # one sampler per loop
    await asyncio.sleep(0.12)
    time.sleep(0.3)  # a callback that holds the loop for 300 ms
    await asyncio.sleep(0.12)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with m._lock:
        worst = max(late for _, late in m._samples)
    assert worst >= 0.25, worst
    assert (REGISTRY.get_sample_value("agent_loop_lag_seconds_count") or 0.0) >= n0 + 3
    assert REGISTRY.get_sample_value("agent_loop_lag_seconds_bucket", {"le": "0.16"}) is not None
