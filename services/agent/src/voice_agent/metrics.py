"""Per-turn timings with a trace id, Prometheus histograms, one log line per turn.

A turn starts at the user's end of turn (EoT: when the user's last speech sample arrived,
as the VAD's end of speech locates it in the audio: speech_end.py) and gets a trace id
that travels to the thinker (request_id) and the TTS (SessionConfig.trace_id), so the
three services' logs join.
The plugins and the audio output report their moments here; the tracker turns them
into the metric names of CONTRIBUTING.md and, at the turn's first published frame,
into the latency report the web page shows (data topic "latency").

Clock: time.perf_counter() for durations (monotonic); wall time only in logs.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .marks import LATENCY_KEYS
from .speech_end import SpeechEnd

log = logging.getLogger("voice_agent.turns")

# The agent's own registry (the service shell: one per service, not the process-wide
# default), served on AGENT_HTTP_PORT by http.py.
REGISTRY = CollectorRegistry()

# Latency buckets from 5 ms to 5 s: the gates live between 20 ms and 650 ms.
_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3, 0.45, 0.65, 1.0, 2.0, 5.0)

EOT_TO_FIRST_AUDIO = Histogram(
    "agent_eot_to_first_audio_seconds", "User end of turn -> first agent audio frame out",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
CANCEL_TO_SILENCE = Histogram(
    "agent_cancel_to_silence_seconds", "Barge-in decision -> agent output silent",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.2),
    registry=REGISTRY,
)
TTS_FIRST_TO_PUBLISH = Histogram(
    "agent_tts_first_to_publish_seconds", "First TTS frame received -> frame published",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.12, 0.3),
    registry=REGISTRY,
)
LLM_TTFT = Histogram(
    "agent_llm_ttft_seconds", "Thinker Chat sent -> first text delta (client side)",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
TTS_TTFA = Histogram(
    "agent_tts_ttfa_seconds", "First text sent to the TTS -> first audio frame (client side)",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
VAD_LAG = Histogram(
    "agent_vad_lag_seconds", "Audio arrived -> the VAD's end-of-speech decision on it, past "
    "the silence it waits for (a busy host decides late)", buckets=_BUCKETS, registry=REGISTRY,
)
EOT_WAIT = Histogram(
    "agent_eot_wait_seconds", "The user's last speech sample -> the end of their turn decided "
    "(the VAD's hangover and the end-of-turn wait: AGENT_TURN_DETECTION, the endpointing "
    "delays)", buckets=_BUCKETS, registry=REGISTRY,
)
STT = Histogram(
    "agent_stt_seconds", "The VAD's end of speech -> the transcript", buckets=_BUCKETS,
    registry=REGISTRY,
)
CONVERSATIONS = Gauge("agent_conversations_active", "Conversations this process carries "
                      "(/v1/talk, direct mode, LiveKit jobs): sessions started, not closed",
                      registry=REGISTRY)
TURNS = Counter("agent_turns_total", "User turns answered (or attempted)", registry=REGISTRY)
INTERRUPTIONS = Counter("agent_interruptions_total", "Barge-ins that cut the agent off",
                        registry=REGISTRY)
BACKCHANNELS = Counter("agent_backchannels_total",
                       "User speech over a reply that paused it and let it resume "
                       "(backchannel words or none)", registry=REGISTRY)
WASTED = Counter("agent_wasted_replies_total", "Replies started early (preemptive generation, "
                 "during the end-of-turn wait) and dropped: the user went on or said more. "
                 "part=llm: thinker calls; part=tts: TTS streams", ["part"], registry=REGISTRY)
for _part in ("llm", "tts"):
    WASTED.labels(part=_part)
ERRORS = Counter("agent_errors_total", "Errors by component", ["component"],
                 registry=REGISTRY)
for _component in ("stt", "llm", "tts"):  # exported at 0 before the first error
    ERRORS.labels(component=_component)


def new_trace_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class Turn:
    trace_id: str
    kind: str  # "user" (answers an utterance) or "say" (greeting, fallback)
    eot: float | None = None  # perf_counter: the user's last speech sample arrived
    vad_end: float | None = None  # when the VAD reported it
    vad_lag: float | None = None  # how late the VAD decided (SpeechEnd.lag_s)
    decided: float | None = None  # the end of the turn decided (the end-of-turn wait ended)
    stt_sent: float | None = None
    stt_done: float | None = None
    llm_sent: float | None = None
    llm_first: float | None = None
    tts_first_text: float | None = None
    tts_first_audio: float | None = None
    first_publish: float | None = None
    reported: bool = False
    llm_calls: int = 0
    marks: dict[str, float] = field(default_factory=dict)

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * 1000.0, 2)

    def report(self) -> dict[str, object]:
        """The per-turn record (logged; its first four keys are the web page's schema)."""
        return {
            "trace_id": self.trace_id,
            "eot_to_first_audio_ms": self.ms(self.eot, self.first_publish),
            "llm_ttft_ms": self.ms(self.llm_sent, self.llm_first),
            "tts_ttfa_ms": self.ms(self.tts_first_text, self.tts_first_audio),
            "kind": self.kind,
            # the STT's own VAD may fire a little before the session's: clamp at 0
            "vad_to_stt_ms": None if (v := self.ms(self.vad_end, self.stt_sent)) is None
            else max(0.0, v),
            "stt_ms": self.ms(self.stt_sent, self.stt_done),
            # the gaps between the stages: the transcript -> the thinker's request (the
            # framework's turn handling), its first text -> the TTS's first text (the bridge)
            "stt_to_llm_ms": self.ms(self.stt_done, self.llm_sent),
            "llm_to_tts_ms": self.ms(self.llm_first, self.tts_first_text),
            "tts_first_to_publish_ms": self.ms(self.tts_first_audio, self.first_publish),
            "vad_lag_ms": None if self.vad_lag is None else round(self.vad_lag * 1000.0, 2),
            # the end-of-turn wait, its own stage: a reply made during it (preemptive
            # generation) waits for it, and its gaps above include it
            "eot_wait_ms": self.ms(self.eot, self.decided),
        }

    def ended(self, end: SpeechEnd) -> None:
        self.eot, self.vad_end, self.vad_lag = end.at, end.decided, end.lag_s


# A turn's record kept for a later VAD event of the same speech (the session's and the
# STT's VAD streams each report it): ends this close are one end.
SAME_END_S = 0.1


class TurnTracker:
    """The moments of the current turn; one tracker per conversation (session)."""

    def __init__(self, *, on_report: Callable[[dict[str, object]], None] | None = None) -> None:
        self.current: Turn | None = None
        self.history: list[dict[str, object]] = []
        self.cancel_to_silence: list[float] = []
        self.speech_end: SpeechEnd | None = None  # the VADs' latest (speech_end.TimedVAD)
        # told of each located end as it comes (the audio turn model starts on it)
        self.speech_end_listeners: list[Callable[[SpeechEnd], None]] = []
        self._on_report = on_report
        self._stt: tuple[float, float | None] | None = None
        self._answered_eot = float("-inf")  # the last reported user turn's

    # --- turn boundaries ---------------------------------------------------------------
    def vad_speech_ended(self, end: SpeechEnd) -> None:
        """A VAD stream of this conversation located an end of speech."""
        self.speech_end = end
        for listener in self.speech_end_listeners:
            try:
                listener(end)
            except Exception:  # a broken listener must not break the VAD's stream
                log.exception("speech end listener failed")

    def end_of_speech(self, now: float, silence_s: float) -> SpeechEnd:
        """The end of speech the VAD just reported (its user state went to listening at
        `now`); without a located one (no TimedVAD), `now` back-dated by `silence_s`."""
        end = self.speech_end
        if end is not None and now - 2.0 <= end.decided <= now:
            return end
        return SpeechEnd(at=now - silence_s, decided=now, silence_s=silence_s)

    def user_turn_ended(self, end: SpeechEnd) -> Turn:
        """VAD end of speech: a new user turn (its reply comes next)."""
        cur = self.current
        if (cur is not None and cur.kind == "user" and cur.eot is not None and cur.reported
                and abs(cur.eot - end.at) < SAME_END_S):
            return cur  # answered already (a faster VAD stream's end): the same speech
        if (cur is not None and cur.kind == "user" and not cur.reported and cur.eot is None
                and cur.llm_sent is not None and cur.llm_sent >= end.at):
            # the reply already started (preemptive generation on a transcript that beat
            # this VAD event): it is this turn's reply
            turn = cur
        else:
            if cur is not None and cur.kind == "user" and not cur.reported:
                wasted(cur)  # its reply was started early and the user went on
            turn = Turn(trace_id=new_trace_id(), kind="user")
            self.current = turn
        self._start(turn, end)
        return turn

    def _start(self, turn: Turn, end: SpeechEnd) -> None:
        turn.ended(end)
        if end.lag_s is not None:
            VAD_LAG.observe(max(0.0, end.lag_s))
        self._adopt_stt(turn)
        TURNS.inc()
        log.info("turn start trace_id=%s kind=user", turn.trace_id)

    def turn_decided(self, at: float | None = None) -> None:
        """The user's turn is over (the end-of-turn policy's wait ended): its reply may
        be heard from now."""
        turn = self.current
        if turn is None or turn.kind != "user" or turn.decided is not None or turn.reported:
            return
        turn.decided = at if at is not None else time.perf_counter()
        if turn.eot is not None:
            EOT_WAIT.observe(max(0.0, turn.decided - turn.eot))

    def ensure_turn(self, kind: str = "say") -> Turn:
        """The turn the next reply belongs to; a reply without an utterance (greeting,
        fallback) opens its own."""
        if self.current is None or self.current.reported:
            self.current = Turn(trace_id=new_trace_id(), kind=kind)
        return self.current

    # --- moments reported by the plugins -------------------------------------------------
    # The STT request and the VAD's end-of-speech event race (two VAD streams run in
    # the framework): its moments are kept here and adopted by the turn they belong to.
    def stt_started(self) -> None:
        self._stt = (time.perf_counter(), None)
        turn = self.current  # a turn already under way (its reply began on a preflight)
        if turn is not None and turn.kind == "user" and not turn.reported:
            self._adopt_stt(turn)

    def stt_busy(self, since: float) -> bool:
        """A transcription started at or after `since` (perf_counter) is still running."""
        return self._stt is not None and self._stt[0] >= since and self._stt[1] is None

    def stt_done(self) -> None:
        if self._stt is not None:
            self._stt = (self._stt[0], time.perf_counter())
            # The turn may have adopted this request before it finished: complete it.
            turn = self.current
            if turn is not None and turn.stt_sent == self._stt[0] and turn.stt_done is None:
                turn.stt_done = self._stt[1]

    def _adopt_stt(self, turn: Turn) -> None:
        """The transcription of this turn's speech: the latest, if sent after it ended."""
        if self._stt is None or turn.eot is None or turn.stt_sent is not None:
            return
        sent, done = self._stt
        if sent >= turn.eot:
            turn.stt_sent, turn.stt_done = sent, done

    def llm_started(self) -> str:
        """A thinker call of this turn starts; returns its request_id.

        The first call's id is the trace id; later ones (the framework's preemptive
        generation is replaced by the final one) add "-2", "-3": the thinker refuses an
        id that is still generating, and a cancelled call's abort may not have reached it.
        """
        turn = self.ensure_turn("user")
        self._adopt_stt(turn)
        if turn.llm_calls and turn.first_publish is None:
            # a newer call replaces one never heard (a preflight on words the user went
            # on from, then on the whole turn): the turn's timings are the newest call's;
            # the TTS work of the one replaced is lost (its thinker call: at _finish)
            if turn.tts_first_text is not None:
                WASTED.labels(part="tts").inc()
            turn.llm_sent = turn.llm_first = turn.tts_first_text = turn.tts_first_audio = None
        if turn.llm_sent is None:
            turn.llm_sent = time.perf_counter()
        turn.llm_calls += 1
        return turn.trace_id if turn.llm_calls == 1 else f"{turn.trace_id}-{turn.llm_calls}"

    def llm_first_token(self) -> None:
        turn = self.current
        if turn is not None and turn.llm_first is None and turn.llm_sent is not None:
            turn.llm_first = time.perf_counter()
            LLM_TTFT.observe(turn.llm_first - turn.llm_sent)

    def tts_text_sent(self) -> str:
        turn = self.ensure_turn()
        if turn.tts_first_text is None:
            turn.tts_first_text = time.perf_counter()
        return turn.trace_id

    def tts_audio_received(self) -> None:
        turn = self.current
        if turn is not None and turn.tts_first_audio is None and turn.tts_first_text is not None:
            turn.tts_first_audio = time.perf_counter()
            TTS_TTFA.observe(turn.tts_first_audio - turn.tts_first_text)

    def audio_published(self, at: float | None = None) -> None:
        """The first frame of the reply left the agent (room track / output device)."""
        turn = self.current
        if turn is None or turn.first_publish is not None:
            return
        turn.first_publish = at if at is not None else time.perf_counter()
        end = self.speech_end
        if (turn.kind == "user" and turn.eot is None and end is not None
                and end.at > self._answered_eot + SAME_END_S
                and end.decided <= turn.first_publish):
            # a reply to speech whose turn the session's VAD has not ended (yet): its
            # transcript came from the STT's own VAD stream, which located the end first
            self._start(turn, end)
        if turn.tts_first_audio is not None:
            TTS_FIRST_TO_PUBLISH.observe(max(0.0, turn.first_publish - turn.tts_first_audio))
        if turn.eot is not None:
            EOT_TO_FIRST_AUDIO.observe(turn.first_publish - turn.eot)
        self._finish(turn)

    def interrupted(self, cancel_to_silence_s: float) -> None:
        INTERRUPTIONS.inc()
        CANCEL_TO_SILENCE.observe(cancel_to_silence_s)
        self.cancel_to_silence.append(cancel_to_silence_s)
        trace = self.current.trace_id if self.current else "-"
        log.info("barge-in trace_id=%s cancel_to_silence_ms=%.2f", trace,
                 cancel_to_silence_s * 1000)

    def error(self, component: str, err: object) -> None:
        ERRORS.labels(component=component).inc()
        trace = self.current.trace_id if self.current else "-"
        log.warning("error component=%s trace_id=%s: %s", component, trace, err)

    def _finish(self, turn: Turn) -> None:
        turn.reported = True
        if turn.llm_calls > 1:  # the early calls were replaced by the one heard
            WASTED.labels(part="llm").inc(turn.llm_calls - 1)
        if turn.kind == "user" and turn.eot is not None:
            self._answered_eot = turn.eot
        if turn.vad_end is not None and turn.stt_done is not None:
            STT.observe(max(0.0, turn.stt_done - turn.vad_end))
        rec = turn.report()
        self.history.append(rec)
        log.info("turn %s", json.dumps(rec, ensure_ascii=False))
        if self._on_report is not None:
            try:
                self._on_report({k: rec[k] for k in LATENCY_KEYS})
            except Exception:  # a broken listener must not break the turn
                log.exception("latency report listener failed")


def wasted(turn: Turn) -> None:
    """A turn dropped before its reply was heard: the work its reply had started."""
    if turn.llm_calls:
        WASTED.labels(part="llm").inc(turn.llm_calls)
    if turn.tts_first_text is not None:
        WASTED.labels(part="tts").inc()
