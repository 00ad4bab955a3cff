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

Backchannels (with a `BackchannelPolicy`): user speech over a reply that can pause first
PAUSES it (the output stops within a frame, the thinker and the TTS go on filling
it), and the controller waits to learn what the speech was. Words that ask for the turn,
or talk longer than the policy's limit, run the cascade above (the pause was the cut);
"yeah", "okay" or no words at all (a cough) resume the reply where it paused and drop
the user's turn. The framework's own interruption is kept out of this decision
(`FRAMEWORK_NEVER_INTERRUPTS`): it would cut the reply on the VAD or on any transcript.

The controller also marks the turn boundaries for the tracker: the VAD end of speech
is the user's end of turn (when their last speech sample arrived, as the VAD located it:
speech_end.py).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from livekit.agents.voice import AgentSession
from livekit.agents.voice.events import (
    AgentStateChangedEvent,
    UserInputTranscribedEvent,
    UserStateChangedEvent,
)

from .backchannel import BackchannelPolicy
from .metrics import BACKCHANNELS, TurnTracker
from .plugins.llm import LLM
from .plugins.tts import TTS
from .speech_end import SpeechEnd

log = logging.getLogger("voice_agent.duplex")

# When to read the speaker's ticks after a barge-in (a few frames later).
_SILENCE_CHECK_S = 0.1
# A paused reply waits for a transcription still running (a loaded host) this long at
# most after the user stopped, then resumes as if no words came.
_STT_WAIT_MAX_S = 3.0

# The session's interruption "min_words" when the controller decides backchannels: the
# framework then neither cuts a reply on the VAD or a transcript (its gate needs this
# many words) nor answers a turn spoken over a reply it did not see cut (the controller
# cuts the reply first when the words ask for the turn).
FRAMEWORK_NEVER_INTERRUPTS = 1_000_000


class DuplexState(enum.Enum):
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"
    PAUSED = "paused"  # the user spoke over the reply: held until we know what it was
    INTERRUPTING = "interrupting"


@dataclass
class BargeIn:
    decided_at: float  # perf_counter of the decision to go silent (VAD start of speech)
    cut_at: float  # the cascade began (after decided_at by the pause, if paused first)
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
        backchannel: BackchannelPolicy | None = None,
        reports_first_audio: bool = True,
    ) -> None:
        self._session = session
        # the framework's "speaking" = the reply's first frame out, unless the output
        # reports it itself, later (the WebSocket transport: when the socket took it)
        self._reports_first_audio = reports_first_audio
        self._tracker = tracker
        self._llm = llm
        self._tts = tts
        self._vad_silence_s = vad_silence_s
        self._allow = allow_interruptions
        # how to learn when the output fell silent (our speaker knows; a room track
        # does not, then "silent" is when the cascade returned)
        self._silent_from = silent_from
        self._backchannel = backchannel
        # the pause in progress: when it began, whether the user is talking, whether
        # only backchannel words were heard, the user's end of turn if it came
        self._paused_at: float | None = None
        self._user_speaking = False
        self._heard_backchannel = False
        self._held_turn_end: SpeechEnd | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self.backchannels = 0
        self.state = DuplexState.LISTENING
        self.transitions: list[tuple[float, DuplexState]] = [
            (time.perf_counter(), DuplexState.LISTENING)
        ]
        self.barge_ins: list[BargeIn] = []
        self._listeners: list[Callable[[DuplexState], None]] = []
        session.on("agent_state_changed", self._on_agent_state)
        session.on("user_state_changed", self._on_user_state)
        if backchannel is not None:
            session.on("user_input_transcribed", self._on_transcribed)

    @property
    def allow_interruptions(self) -> bool:
        return self._allow

    @allow_interruptions.setter
    def allow_interruptions(self, allow: bool) -> None:  # a Realtime session's turn setting
        self._allow = allow

    def on_state(self, fn: Callable[[DuplexState], None]) -> None:
        self._listeners.append(fn)

    def _set(self, state: DuplexState) -> None:
        if state == self.state:
            return
        log.debug("duplex %s -> %s", self.state.name, state.name)
        if self.state == DuplexState.PAUSED:
            self._end_pause()
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
            if self._reports_first_audio:
                self._tracker.audio_published()
            self._set(DuplexState.SPEAKING)
        elif ev.new_state in ("listening", "idle"):
            self._set(DuplexState.LISTENING)

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking":
            self._user_speaking = True
            if self.state == DuplexState.PAUSED:
                self._cancel_timers()  # they go on: the length limit counts from the pause
                self._arm(self._too_long, max(0.0, self._paused_at + self._backchannel
                                              .max_speech_s - time.perf_counter()))
            elif self._allow and self.state == DuplexState.SPEAKING and self._can_pause():
                self._pause()
            elif self._allow and self.state in (DuplexState.SPEAKING, DuplexState.THINKING):
                self.barge_in()
        elif ev.new_state == "listening" and ev.old_state == "speaking":
            self._user_speaking = False
            now = time.perf_counter()
            turn_end = self._tracker.end_of_speech(now, self._vad_silence_s)
            if self.state == DuplexState.PAUSED:
                # not a turn yet: a backchannel is none; a cut makes it one (barge_in)
                self._held_turn_end = turn_end
                self._cancel_timers()
                if self._heard_backchannel:
                    self._resume("backchannel words")
                else:
                    self._arm(lambda: self._no_words(now + _STT_WAIT_MAX_S),
                              self._backchannel.wait_s)
            else:
                self._tracker.user_turn_ended(turn_end)

    def _on_transcribed(self, ev: UserInputTranscribedEvent) -> None:
        if not ev.is_final or not ev.transcript.strip():
            return
        assert self._backchannel is not None
        listener_talk = self._backchannel.is_backchannel(ev.transcript)
        if self.state == DuplexState.PAUSED:
            if not listener_talk:
                self.barge_in()
            elif self._user_speaking:
                self._heard_backchannel = True  # resume when they stop
            else:
                self._resume("backchannel words")
        elif (self._allow and not listener_talk
              and self.state in (DuplexState.SPEAKING, DuplexState.THINKING)):
            # words the VAD missed, or that came after a resume: the framework no
            # longer cuts on a transcript, so this does
            self.barge_in()

    # --- the pause ----------------------------------------------------------------------------
    def _can_pause(self) -> bool:
        audio = self._session.output.audio
        return self._backchannel is not None and audio is not None and audio.can_pause

    def _pause(self) -> None:
        assert self._backchannel is not None and self._session.output.audio is not None
        self._session.output.audio.pause()
        self._set(DuplexState.PAUSED)
        self._paused_at = time.perf_counter()
        self._heard_backchannel = False
        self._held_turn_end = None
        self._arm(self._too_long, self._backchannel.max_speech_s)
        log.info("reply paused: user speech over it")

    def _no_words(self, deadline: float) -> None:
        """No transcript came in the wait: resume, unless the recogniser is still on
        this speech (then its words decide, up to `deadline`)."""
        busy = self._paused_at is not None and self._tracker.stt_busy(self._paused_at)
        if busy and time.perf_counter() < deadline:
            self._arm(lambda: self._no_words(deadline), 0.05)
        else:
            self._resume("no words")

    def _too_long(self) -> None:
        if self.state == DuplexState.PAUSED and self._user_speaking:
            self.barge_in()

    def _resume(self, why: str) -> None:
        if self.state != DuplexState.PAUSED:
            return
        paused_s = time.perf_counter() - (self._paused_at or 0.0)
        audio = self._session.output.audio
        if audio is not None:
            audio.resume()
        try:  # the backchannel's words must not open the user's next turn
            self._session.clear_user_turn()
        except RuntimeError as e:  # the session is closing
            log.info("session.clear_user_turn(): %s", e)
        self.backchannels += 1
        BACKCHANNELS.inc()
        log.info("reply resumed after %.0f ms (%s)", paused_s * 1000, why)
        self._set(DuplexState.SPEAKING)

    def _end_pause(self) -> None:
        self._cancel_timers()
        self._paused_at = None

    def _arm(self, fn: Callable[[], None], after_s: float) -> None:
        self._timers.append(asyncio.get_running_loop().call_later(after_s, fn))

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    # --- the cascade --------------------------------------------------------------------------
    def barge_in(self) -> BargeIn:
        # a paused reply fell silent when the pause began: that was the decision
        paused = self.state == DuplexState.PAUSED
        decided = self._paused_at if paused and self._paused_at is not None else (
            time.perf_counter())
        held = self._held_turn_end if paused else None
        before = DuplexState.SPEAKING if paused else self.state
        start = time.perf_counter()
        self._set(DuplexState.INTERRUPTING)
        n_llm = self._llm.cancel_all() if self._llm is not None else 0
        n_tts = self._tts.stop_all() if self._tts is not None else 0
        audio = self._session.output.audio
        if audio is not None:
            audio.clear_buffer()
            if paused:
                audio.resume()  # the next reply plays
        cleared = time.perf_counter()
        if held is not None:  # the user's words came after their speech ended
            self._tracker.user_turn_ended(held)
        try:
            self._session.interrupt()
        except RuntimeError as e:  # an uninterruptible speech, or the session is closing
            log.info("session.interrupt(): %s", e)
        trace = self._tracker.current.trace_id if self._tracker.current else "-"
        # without a speaker to ask: silent when the cascade was done (the pause, if any,
        # had already stopped the output)
        b = BargeIn(decided_at=decided, cut_at=start, cleared_at=cleared,
                    silent_at=decided + (cleared - start),
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
        log.info("barge-in in %s%s: thinker calls cancelled=%d, tts streams stopped=%d, "
                 "cascade %.2f ms", before.name,
                 f" (paused {(start - decided) * 1000:.0f} ms before)" if paused else "",
                 n_llm, n_tts, (cleared - start) * 1000)
        self._set(DuplexState.LISTENING)
        return b
