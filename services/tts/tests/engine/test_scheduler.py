"""The scheduler is CPU bookkeeping: plain views in, plain session ids out."""

from __future__ import annotations

from voice_tts.engine.scheduler import Need, Scheduler, SessionView


def test_policy():
    views = [SessionView(1, Need.DECODE, 5.0), SessionView(2, Need.PREFILL, 3.0),
             SessionView(3, Need.NOTHING, 1.0), SessionView(4, Need.DECODE, 2.0),
             SessionView(5, Need.END_EMPTY, 9.0), SessionView(6, Need.PREFILL, 1.0)]
    out = Scheduler(max_batch=8, max_prefills=1).schedule(views)
    assert out.prefill == [6]  # oldest text first, one prompt per step
    assert out.decode == [4, 1]  # every ready session, least recently stepped first
    assert out.end_empty == [5]
    assert Scheduler(max_batch=1, max_prefills=2, batch_decode=False).schedule(views).decode == [4]
    assert Scheduler(8, 1).schedule([SessionView(1, Need.NOTHING, 0.0)]).idle
