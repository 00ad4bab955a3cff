"""Pacing: when a stream's writer writes each frame, and the queue it sleeps on.

**Pacing** (`pace_lead_s`, TTS_PACE_LEAD_S). The engine makes an utterance far faster
than real time; written as fast as it comes, each new stream's burst of hundreds of frames
holds the one event loop while other streams, whose clients have little audio buffered,
wait. So a stream's writer (`stream.py`) writes frame i of an utterance no earlier than
t0 + i x frame_ms - lead (t0: when its first frame was written): the first `lead` of audio
goes out at once (TTFA unchanged), the rest in real time, `lead` ahead of a player started
at the first frame. A writer whose next frame is not due yet sleeps until it is, then
writes every frame due within the slack (`PACE_SLACK_S`, at most lead / 2) in one go: a
few wakeups a second per stream. What wakes it earlier is the `Inbox`'s rule.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Any

# A paced writer, woken for its next frame, also writes the frames due within this much
# more (at most lead / 2): clients hold lead .. lead + slack of audio; ~5 wakeups/s.
PACE_SLACK_S = 0.2
# Paced wakeups are rounded up to this grid of the loop's clock (so up to 10 ms after the
# frame's time): streams due about the same time wake in one turn of the loop.
PACE_TICK_S = 0.01
# A frame due within this much of now is written now.
EARLY_S = 0.002


class Pacer:
    """Frame i of an utterance whose first frame was written at t0 (loop time) is due at
    t0 + i x frame_s - lead. `lead` 0: no pacing."""

    def __init__(self, lead_s: float, frame_s: float, clock: Callable[[], float]) -> None:
        self.lead = max(0.0, lead_s)
        self.frame_s = frame_s
        self.clock = clock  # the event loop's
        self._horizon = -math.inf  # frames due before this go out without the clock

    def hurry(self) -> None:
        """No more pacing (drain): everything left is due now."""
        self.lead = 0.0

    def wake_at(self, t0: float, index: int) -> float | None:
        """None: write frame `index` now; else the loop time to sleep until. Once a frame
        is due, the ones due within the slack are too (one wakeup writes them all)."""
        lead = self.lead
        if lead <= 0.0 or not index:
            return None
        due = t0 + index * self.frame_s - lead
        if due <= self._horizon:
            return None
        now = self.clock()
        if due > now + EARLY_S:
            return math.ceil(due / PACE_TICK_S) * PACE_TICK_S
        self._horizon = now + min(PACE_SLACK_S, lead / 2)
        return None


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Inbox:
    """The writer's queue (loop thread only). A writer waiting with a deadline (it has
    frames not due yet) wakes at it, or at once for an urgent item (a marker: STOP, RESET,
    FLUSH, end of input, failure); engine items wait for it. A writer with nothing to
    pace wakes for any item."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._pacing = False

    def put_nowait(self, item: Any, urgent: bool = True) -> None:
        self.items.append(item)
        if self._waiter is not None and (urgent or not self._pacing):
            _wake(self._waiter)

    def wake(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)

    async def wait(self, deadline: float | None) -> None:
        """Until an item comes (an urgent one, with a deadline) or the loop's clock
        reaches `deadline`."""
        loop = asyncio.get_running_loop()
        self._waiter = fut = loop.create_future()
        self._pacing = deadline is not None
        timer = None if deadline is None else loop.call_at(deadline, _wake, fut)
        try:
            await fut
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
