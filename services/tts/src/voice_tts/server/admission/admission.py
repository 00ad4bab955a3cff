"""Admission: a new call gets in only while the engine can keep every speaking stream
real time; otherwise RESOURCE_EXHAUSTED at once, with a message to retry elsewhere.

What counts as load. A voice agent keeps its TTS stream open and idle most of the time,
so open streams are not the engine's load; streams with text to speak are:
- **speaking**: text pushed for an utterance whose end the engine has not sent. Each
  needs a step every 80 ms until the engine has generated it (well before the client has
  played it: the engine runs ahead of real time).
- **pending**: admitted less than `idle_grace_s` ago and not speaking yet. A call sends
  its text right after its config, so a burst of calls reserves its share before any of
  it shows in the engine's batch.
- **idle** (no text yet past the grace, or everything generated) costs nothing per step
  and does not count. The open-stream cap (TTS_MAX_SESSIONS, the engine's slots) bounds
  idle streams; if they all speak at once they can overload the engine: nobody is cut off
  mid-call, so size TTS_MAX_SESSIONS to the share of open streams that speak at once.

The rules, in order (`admit`):
1. open streams at `max_sessions` -> reject, reason "sessions";
2. speaking + pending == 0 -> admit (an idle engine always takes one: the model learns
   only from admitted work, so it must never lock itself out);
3. the capacity model (`capacity.py`) predicts the engine's frame period with one more
   speaking stream; over the budget (`frame_budget_ms`) -> reject, reason "capacity";
4. the front model predicts the event loop's CPU share with one more open stream (its
   measured share per open stream); over `front_share` of a core -> reject, reason
   "front".
Nothing measured yet -> admit (the open-stream cap still holds). A margin of 0 turns 3
and 4 off.

Counts move on the event loop (admit, text, close) and on the engine thread (utterance
ends), under one lock. This module knows the session API only through `TrackedSession`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from voice_tts.engine import UtteranceEnd
from voice_tts.server.admission.capacity import FramePeriodModel, FrontModel
from voice_tts.server.errors import CallError

RETRY = "retry on another replica"


class Rejected(CallError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__("busy", message)
        self.reason = reason  # label of tts_admission_rejected_total


def frame_budget_ms(margin: float, first_packet_frames: int, packet_frames: int,
                    codec_frame_ms: float, override_ms: float = 0.0) -> float:
    """The longest engine frame period admission allows: `margin` x a codec frame (80 ms:
    the real-time budget of one step), and no more than first_packet_frames /
    packet_frames x 80 ms (20 ms for packets (1, 4)). That was
    the start-up bound of packets of 1 then straight 4; the packet ramp (`packet_ramp`)
    now keeps the start real time up to 60 ms, but the budget stays: it also bounds TTFA
    (one step) and the front's load: with the stand-in at 2x capacity (bench README, "The
    start-up rule"), a 56 ms budget with the ramp admitted 639 of 1006 calls at TTFA p50
    84 ms, 259 of them underrunning (a busy 2-core host); raising it needs a GPU
    measurement. (The 0.6B on an H100 keeps 20 ms to ~190 streams.) `override_ms`
    (TTS_ADMIT_FRAME_BUDGET_MS) replaces it, for that measurement; a margin of 0 is off."""
    if margin <= 0.0:
        return 0.0
    return override_ms or codec_frame_ms * min(margin, first_packet_frames / packet_frames)


class Admission:
    def __init__(self, model: FramePeriodModel, max_sessions: int, budget_ms: float,
                 idle_grace_s: float, codec_frame_ms: float, front: FrontModel | None = None,
                 front_share: float = 0.0) -> None:
        self.model = model
        self.codec_frame_ms = codec_frame_ms  # the engine's: only for the refusal's words
        self.front = front
        self.max_sessions = max_sessions
        self.budget_ms = budget_ms  # 0: rules 3 and 4 off
        self.front_share = front_share
        self.idle_grace_s = idle_grace_s
        self._lock = threading.Lock()
        self._open = 0
        self._speaking = 0
        self._pending: dict[Ticket, float] = {}  # admitted, not speaking yet -> when

    def admit(self, now: float | None = None) -> Ticket:
        """A ticket for the new call, or `Rejected` (RESOURCE_EXHAUSTED) at once."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._open >= self.max_sessions:
                raise Rejected("sessions", f"server at its limit of {self.max_sessions} "
                               f"open streams; {RETRY}")
            self._expire(now)
            load = self._speaking + len(self._pending)
            if load and self.budget_ms > 0:
                period = self.model.predict_ms(load + 1)
                if period is not None and period > self.budget_ms:
                    raise Rejected("capacity", (
                        f"server at capacity: {load} streams speaking or starting; with one "
                        f"more the engine would make a frame every {period:.0f} ms (real "
                        f"time needs one per {self.codec_frame_ms:.0f} ms, the limit is "
                        f"{self.budget_ms:.0f} ms); {RETRY}"))
                share = self._front_share(self._open + 1)
                if share is not None and share > self.front_share:
                    raise Rejected("front", (
                        f"server at capacity: {self._open} streams open; with one more its "
                        f"gRPC front would need {share:.0%} of a core to serve them (the "
                        f"limit is {self.front_share:.0%}); {RETRY}"))
            ticket = Ticket(self)
            self._open += 1
            self._pending[ticket] = now
            return ticket

    # -- what the gauges show -------------------------------------------------------------
    def load(self, now: float | None = None) -> int:
        """Streams counted as load now: speaking + pending."""
        with self._lock:
            self._expire(time.monotonic() if now is None else now)
            return self._speaking + len(self._pending)

    @property
    def speaking(self) -> int:
        return self._speaking

    @property
    def open(self) -> int:
        return self._open

    def _front_share(self, n: int) -> float | None:
        if self.front is None:
            return None
        self.front.sample()
        return self.front.share(n)

    def predicted_front_share(self) -> float:
        """The front's CPU share predicted at the open streams now (0 when unknown)."""
        return self._front_share(self._open) or 0.0

    def predicted_period_ms(self) -> float:
        """Frame period predicted at the current load (0 when idle or unmeasured)."""
        load = self.load()
        return (self.model.predict_ms(load) or 0.0) if load else 0.0

    def headroom(self) -> int:
        """Speaking streams that could still be admitted now."""
        room = self.max_sessions - self._open
        if self.budget_ms > 0:
            room = min(room, self.model.max_streams(self.budget_ms, self.max_sessions)
                       - self.load())
        return max(0, room)

    # -- ticket bookkeeping (under the lock) ----------------------------------------------
    def _expire(self, now: float) -> None:
        old = [t for t, at in self._pending.items() if now - at > self.idle_grace_s]
        for t in old:
            del self._pending[t]

    def _speak(self, t: Ticket) -> None:
        with self._lock:
            self._pending.pop(t, None)
            self._speaking += 1

    def _quiet(self) -> None:
        with self._lock:
            self._speaking -= 1

    def _close(self, t: Ticket, speaking: bool) -> None:
        with self._lock:
            self._pending.pop(t, None)
            self._open -= 1
            if speaking:
                self._speaking -= 1


class Ticket:
    """One admitted call's place in the counts: pending -> speaking <-> idle -> closed."""

    def __init__(self, admission: Admission) -> None:
        self._adm = admission
        self._lock = threading.Lock()
        self._utts: set[int] = set()  # utterances with text, not ended
        self._closed = False

    def text(self, utterance_id: int) -> None:
        with self._lock:
            if self._closed or utterance_id in self._utts:
                return
            self._utts.add(utterance_id)
            if len(self._utts) == 1:
                self._adm._speak(self)

    def ended(self, below: int) -> None:
        """Utterances before `below` are over (ended, cancelled, reset)."""
        with self._lock:
            if self._closed or not self._utts:
                return
            self._utts = {u for u in self._utts if u >= below}
            if not self._utts:
                self._adm._quiet()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._adm._close(self, speaking=bool(self._utts))
            self._utts.clear()

    def sink(self, inner: Any) -> Any:
        """Wraps the stream's sink: utterance ends (engine thread) end speaking."""
        def sink(item: Any) -> None:
            if isinstance(item, UtteranceEnd):
                self.ended(item.utterance_id + 1)
            inner(item)
        return sink


class TrackedSession:
    """The engine session as the stream sees it, telling the ticket when text arrives
    and when utterances are dropped; the rest of what the stream uses passes through."""

    def __init__(self, session: Any, ticket: Ticket) -> None:
        self._session = session
        self._ticket = ticket

    def push_text(self, piece: str | bytes) -> None:
        self._ticket.text(self._session.utterance_id)
        self._session.push_text(piece)

    def cancel(self) -> None:
        self._session.cancel()
        self._ticket.ended(self._session.utterance_id)

    def reset(self, seed: int | None = None) -> None:
        self._session.reset(seed)
        self._ticket.ended(self._session.utterance_id)

    def close(self) -> None:
        self._session.close()
        self._ticket.close()

    # --- the rest of the session, as it is -----------------------------------------------
    @property
    def utterance_id(self) -> int:
        return self._session.utterance_id

    def flush(self) -> None:
        self._session.flush()

    def pause(self) -> None:
        self._session.pause()

    def resume(self) -> None:
        self._session.resume()
