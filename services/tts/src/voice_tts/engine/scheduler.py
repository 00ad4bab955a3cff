"""The scheduler: who runs in this engine step. CPU bookkeeping only, no tensors.

Input: one `SessionView` per open session (what its head utterance needs now). Output: a
plain `SchedulerOutput` the engine hands to the runner. Policy:

- prompts first (they start audio: TTFA), at most `max_prefills` per step, oldest text
  first;
- then ONE batched talker step over every running utterance whose next text-track token
  is known (continuous batching: sessions join and leave between steps), up to
  `max_batch` rows, least-recently-stepped first so nobody starves;
- a running utterance whose next text token has not arrived (and no flush) waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Need(Enum):
    NOTHING = 0  # idle, or waiting for text
    PREFILL = 1  # has enough text for its prompt
    DECODE = 2  # running, next text-track token known
    END_EMPTY = 3  # flushed with no speakable text: end at once


@dataclass(frozen=True)
class SessionView:
    session_id: int
    need: Need
    since: float  # when the need arose (first text / last step), for fairness


@dataclass
class SchedulerOutput:
    prefill: list[int] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)
    end_empty: list[int] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (self.prefill or self.decode or self.end_empty)


class Scheduler:
    def __init__(self, max_batch: int, max_prefills: int, batch_decode: bool = True) -> None:
        self.max_batch = max_batch if batch_decode else 1
        self.max_prefills = max_prefills

    def schedule(self, views: list[SessionView]) -> SchedulerOutput:
        out = SchedulerOutput()
        by_age = sorted(views, key=lambda v: (v.since, v.session_id))
        out.end_empty = [v.session_id for v in by_age if v.need is Need.END_EMPTY]
        out.prefill = [v.session_id for v in by_age if v.need is Need.PREFILL][
            : self.max_prefills]
        out.decode = [v.session_id for v in by_age if v.need is Need.DECODE][: self.max_batch]
        return out
