"""The duplex controller: LISTENING / THINKING / SPEAKING / INTERRUPTING, and barge-in.

It follows the session's own events (agent state thinking/speaking/listening, user
state speaking/listening from the VAD) and adds what the framework does not do at
once: when the user starts speaking while the agent is THINKING or SPEAKING, it
cascades in one synchronous step, in this order:
  1. cancel the thinker call (gRPC cancel: the thinker aborts the generation),
  2. STOP the TTS stream (Control STOP; frames after it are dropped client-side too),
  3. clear the audio output buffer (the room track's queue / our speaker),
then asks the session to interrupt the speech, which records the reply in the chat
context as far as it was heard (the transcript synchronizer's playback position).
Doing 1–3 in the VAD event's own callback, instead of waiting for the framework's
interruption task, is what bounds cancel→silence to the frame already playing.

The controller also marks the turn boundaries for the tracker: the VAD end of speech
is the user's end of turn (back-dated by the silence hangover).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from livekit.agents.voice import AgentSession
from livekit.agents.voice.events import AgentStateChangedEvent, UserStateChangedEvent

from .metrics import TurnTracker
from .plugins.llm import LLM
from .plugins.tts import TTS

log = logging.getLogger("voice_agent.duplex")

# When to read the speaker's ticks after a barge-in (a few frames later).
_SILENCE_CHECK_S = 0.1


def framework_last_speaking_time(session: AgentSession) -> float | None:
    """When the framework's VAD last heard the user (wall clock), or None.

    livekit-agents knows this but keeps it private and sends it in no event (1.8.x:
    `AgentSession._activity._audio_recognition.last_speaking_time`); this is the one
    place the agent reads private attributes of framework objects (warmup.py imports a
    private function, which fails loudly if it moves). A changed attribute chain gives
    None and the caller falls back; tests/test_duplex_framework.py fails on such a
    version."""
    activity = getattr(session, "_activity", None)
    recognition = getattr(activity, "_audio_recognition", None)
    last = getattr(recognition, "last_speaking_time", None)
    return last if isinstance(last, float) else None


class DuplexState(enum.Enum):
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"
    INTERRUPTING = "interrupting"


@dataclass
class BargeIn:
    decided_at: float  # perf_counter of the decision (VAD start of speech)
    cleared_at: float  # after the cascade's last step
    silent_at: float  # when the output fell silent
    state_before: DuplexState
    llm_cancelled: int
    tts_stopped: int
    trace_id: str

    @property
    def cancel_to_silence_s(self) -> float:
        return self.silent_at - self.decided_at


class DuplexController:
    def __init__(
        self,
        session: AgentSession,
        *,
        tracker: TurnTracker,
        llm: LLM | None = None,
        tts: TTS | None = None,
        vad_silence_s: float = 0.2,
        allow_interruptions: bool = True,
        silent_from: Callable[[float], float] | None = None,
    ) -> None:
        self._session = session
        self._tracker = tracker
        self._llm = llm
        self._tts = tts
        self._vad_silence_s = vad_silence_s
        self._allow = allow_interruptions
        # how to learn when the output fell silent (our speaker knows; a room track
        # does not, then "silent" is when the cascade returned)
        self._silent_from = silent_from
        self.state = DuplexState.LISTENING
        self.transitions: list[tuple[float, DuplexState]] = [
            (time.perf_counter(), DuplexState.LISTENING)
        ]
        self.barge_ins: list[BargeIn] = []
        self._listeners: list[Callable[[DuplexState], None]] = []
        session.on("agent_state_changed", self._on_agent_state)
        session.on("user_state_changed", self._on_user_state)

    def on_state(self, fn: Callable[[DuplexState], None]) -> None:
        self._listeners.append(fn)

    def _set(self, state: DuplexState) -> None:
        if state == self.state:
            return
        log.debug("duplex %s -> %s", self.state.name, state.name)
        self.state = state
        self.transitions.append((time.perf_counter(), state))
        for fn in list(self._listeners):
            fn(state)

    # --- session events ---------------------------------------------------------------------
    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        if ev.new_state == "thinking":
            self._set(DuplexState.THINKING)
        elif ev.new_state == "speaking":
            # the framework says "speaking" at playback start: the first frame published
            self._tracker.audio_published()
            self._set(DuplexState.SPEAKING)
        elif ev.new_state in ("listening", "idle"):
            self._set(DuplexState.LISTENING)

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking":
            if self._allow and self.state in (DuplexState.SPEAKING, DuplexState.THINKING):
                self.barge_in()
        elif ev.new_state == "listening" and ev.old_state == "speaking":
            now = time.perf_counter()
            self._tracker.user_turn_ended(vad_end=now, silence_s=self._silence_before(now))

    def _silence_before(self, now: float) -> float:
        """How long ago the user actually stopped (silence + inference lag, as the
        framework's VAD bookkeeping knows it); else the configured hangover."""
        last = framework_last_speaking_time(self._session)
        if last is not None:
            ago = time.time() - last
            if 0.0 <= ago < 5.0:
                return ago
        return self._vad_silence_s

    # --- the cascade --------------------------------------------------------------------------
    def barge_in(self) -> BargeIn:
        decided = time.perf_counter()
        before = self.state
        self._set(DuplexState.INTERRUPTING)
        n_llm = self._llm.cancel_all() if self._llm is not None else 0
        n_tts = self._tts.stop_all() if self._tts is not None else 0
        audio = self._session.output.audio
        if audio is not None:
            audio.clear_buffer()
        cleared = time.perf_counter()
        try:
            self._session.interrupt()
        except RuntimeError as e:  # an uninterruptible speech, or the session is closing
            log.info("session.interrupt(): %s", e)
        trace = self._tracker.current.trace_id if self._tracker.current else "-"
        b = BargeIn(decided_at=decided, cleared_at=cleared, silent_at=cleared,
                    state_before=before, llm_cancelled=n_llm, tts_stopped=n_tts,
                    trace_id=trace)
        self.barge_ins.append(b)

        def _measure() -> None:
            if self._silent_from is not None:
                b.silent_at = self._silent_from(decided)
            if before == DuplexState.SPEAKING:
                self._tracker.interrupted(b.cancel_to_silence_s)

        if self._silent_from is not None:
            # the speaker knows when it fell silent only after its next ticks
            asyncio.get_running_loop().call_later(_SILENCE_CHECK_S, _measure)
        else:
            _measure()
        log.info("barge-in in %s: thinker calls cancelled=%d, tts streams stopped=%d, "
                 "cascade %.2f ms", before.name, n_llm, n_tts, (cleared - decided) * 1000)
        self._set(DuplexState.LISTENING)
        return b
