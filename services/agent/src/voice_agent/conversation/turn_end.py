"""The end of the user's turn, decided one way for every door.

At each silence after speech (the VAD's end of speech), a detector says how likely the
turn is over from what it has: the transcript's words (turn_words.py) and how sure the
ear was of where they end (sphinx.py `Heard`), the turn's audio (Smart Turn v3.2,
smart_turn.py), or both. Below 0.5 the turn stays open up to
`max_endpointing_delay_s` after the last speech sample (in doubt: the user may go on),
else `min_endpointing_delay_s` (confident), or `short_turn_delay_s` for a turn of a word or
two ("Hello," may go on after a comma's pause). A user who speaks again meanwhile keeps the
turn open. AGENT_TURN_DETECTION picks the detector:

- `text`: the word rule; words the ear doubts (AGENT_TURN_EAR_MIN_END/_LAST) are in doubt;
- `audio`: Smart Turn on the turn's last <= 8 s of audio;
- `fused`: words that cannot end a turn ("... how to get to") hold it whatever the audio
  says; else the audio decides (a turn whose words could end, but whose voice goes on);
- `model`: livekit-agents' local text model; `vad`: silence alone.

Every door's AgentSession (/v1/talk, /v1/realtime, LiveKit rooms, direct mode) asks its
conversation's `TurnEnd` through livekit-agents' turn-detector protocol, so a setting
reaches every door. A detector that fails falls back to the word rule for that turn (one
WARNING, and agent_turn_detector_errors_total).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from livekit.agents import llm
from livekit.agents.inference.eot import TurnDetector
from prometheus_client import Counter, Histogram

from .. import smart_turn
from ..metrics import REGISTRY, SAME_END_S, TurnTracker
from ..plugins.utterances import UtteranceStore
from ..settings import AgentSettings
from ..speech_end import SpeechEnd
from ..sphinx import Heard
from ..turn_words import end_of_turn_probability

log = logging.getLogger("voice_agent.turn_end")

THRESHOLD = 0.5  # below: the turn is unlikely over (the framework's `unlikely_threshold`)
GOING_ON = 0.05  # the caller spoke again during a short turn's wait: held
EAR_UNSURE = 0.2  # the words could end a turn, but the ear doubts they ended: in doubt
_WORD = re.compile(r"[A-Za-z0-9']+")
AUDIO_FRESH_S = 3.0  # a located end of speech older than this is not this silence's

DECISIONS = Counter("agent_turn_decisions_total", "End-of-turn decisions at a silence, by "
                    "detector and result (end: the short wait; hold: the long one; doubt: "
                    "the long one, as the ear doubted where its words end)",
                    ["detector", "result"], registry=REGISTRY)
DETECTOR_ERRORS = Counter("agent_turn_detector_errors_total", "End-of-turn detectors that "
                          "failed (that turn fell back to the word rule)", ["detector"],
                          registry=REGISTRY)
DETECTOR_SECONDS = Histogram("agent_turn_detector_seconds", "One end-of-turn decision's "
                             "time (the audio model's inference, batched per process)",
                             ["detector"], buckets=(0.001, 0.003, 0.01, 0.02, 0.05, 0.1,
                                                    0.2, 0.5), registry=REGISTRY)


@dataclass(frozen=True)
class TurnView:
    """What a detector has at a silence: the words heard, and the turn's audio (float32
    at 16 kHz, up to the VAD's decision; None where no audio was kept), with the audio
    model's answer on it if already asked (`early`: started at the VAD's end of speech,
    while the ear transcribes)."""
    transcript: str
    audio: np.ndarray | None = None
    early: asyncio.Future[float] | None = None
    ear: Heard | None = None  # how sure the ear was of the transcript's last words


class Detector(Protocol):
    name: str

    async def p_end(self, view: TurnView) -> float: ...


class WordDetector:
    """The word rule on what the ear wrote, unless the ear doubts where its words end
    (`Heard.sure`): then in doubt too."""
    name = "text"

    def __init__(self, min_end: float = 0.0, min_last: float = 0.0) -> None:
        self.min_end, self.min_last = min_end, min_last

    async def p_end(self, view: TurnView) -> float:
        p = end_of_turn_probability(view.transcript)
        if p >= THRESHOLD and view.ear is not None \
                and not view.ear.sure(self.min_end, self.min_last):
            return EAR_UNSURE
        return p


class AudioDetector:
    """Smart Turn on the turn's audio (batched with the process's other conversations)."""
    name = "audio"

    def __init__(self, model: Any) -> None:
        self.model = model

    async def p_end(self, view: TurnView) -> float:
        if view.early is not None:
            return float(await view.early)
        if view.audio is None or not len(view.audio):
            raise ValueError("no audio of the turn was kept")
        return float(await self.model.predict(view.audio))


class FusedDetector:
    """Unfinished words (or words the ear doubts) hold the turn; else the audio decides."""
    name = "fused"

    def __init__(self, model: Any, words: WordDetector | None = None) -> None:
        self.audio = AudioDetector(model)
        self.words = words or WordDetector()

    async def p_end(self, view: TurnView) -> float:
        words = await self.words.p_end(view)
        if words < THRESHOLD:
            return words
        return await self.audio.p_end(view)


def make_detector(settings: AgentSettings, mode: str | None = None) -> Detector | None:
    """The detector AGENT_TURN_DETECTION (or `mode`) names; None for "vad" and "model"
    (silence alone; the framework's own model)."""
    mode = mode or settings.turn_detection
    words = WordDetector(settings.turn_ear_min_end, settings.turn_ear_min_last)
    if mode == "text":
        return words
    if mode in ("audio", "fused"):
        model = smart_turn.load(settings.smart_turn_model, settings.smart_turn_threads)
        return AudioDetector(model) if mode == "audio" else FusedDetector(model, words)
    return None


@dataclass
class Decision:
    """The latest decision of a conversation (the feedback recorder saves it)."""
    detector: str
    transcript: str
    p_end: float
    wait_s: float
    at: float  # perf_counter
    audio: np.ndarray | None  # float32 16 kHz, the turn as the detector heard it
    stop_s: float | None = None  # where in `audio` the speech stopped
    fallback: bool = False


class TurnEnd:
    """One conversation's end-of-turn detector, in livekit-agents' turn-detector protocol
    (voice/turn.py), its audio the VAD's (the tracker's latest located end of speech)."""

    def __init__(self, settings: AgentSettings, detector: Detector,
                 tracker: TurnTracker | None = None) -> None:
        self.settings = settings
        self.detector = detector
        self.tracker = tracker
        self.last: Decision | None = None
        # audio mode (AGENT_STT_MODE=audio): the turn's transcript is utterance markers;
        # the words the background ear says are waited for, within the shortest wait
        self.utterances: UtteranceStore | None = None
        self.vad: Any = None  # the conversation's TimedVAD: does the caller go on?
        self.ear: Any = None  # the conversation's STT: how sure it was (`last_heard`)
        # how soon this conversation's turns end: every wait scales by it (a Realtime
        # session's semantic_vad eagerness, `eagerness_scale`)
        self.scale = 1.0
        self._words = WordDetector(settings.turn_ear_min_end, settings.turn_ear_min_last)
        # the audio model's answer, asked at the VAD's end of speech (its audio is there;
        # the transcript comes 50-300 ms later): (that end, its audio, the answer)
        self._early: tuple[SpeechEnd, np.ndarray, asyncio.Future[float]] | None = None
        self._model = getattr(detector, "model", None) or getattr(
            getattr(detector, "audio", None), "model", None)
        if tracker is not None and self._model is not None:
            tracker.speech_end_listeners.append(self._speech_ended)

    def _speech_ended(self, end: SpeechEnd) -> None:
        """Ask the audio model now, on the audio the VAD decided on (once per end: the
        session's and the ear's VAD streams both report it)."""
        if end.audio is None or self._model is None:
            return
        if self._early is not None and abs(self._early[0].at - end.at) < SAME_END_S:
            return
        audio = smart_turn.to_16k(end.audio, end.rate)
        fut = asyncio.ensure_future(self._model.predict(audio))
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # said in p_end
        self._early = (end, audio, fut)

    @property
    def model(self) -> str:
        return f"voice-agent-{self.detector.name}"

    @property
    def provider(self) -> str:
        return "voice_agent"

    async def unlikely_threshold(self, language: str | None) -> float | None:
        return THRESHOLD

    async def supports_language(self, language: str | None) -> bool:
        # The words are English; so were Smart Turn's main data. The offline ears say no
        # language (None).
        return language is None or str(language).lower().startswith("en")

    async def predict_end_of_turn(self, chat_ctx: llm.ChatContext, *,
                                  timeout: float | None = None) -> float:
        users = [m for m in chat_ctx.messages() if m.role == "user"]
        text = (users[-1].text_content or "") if users else ""
        p = await self.p_end(text)
        if p < THRESHOLD:
            return p
        end = self.tracker.speech_end if self.tracker is not None else None
        if self.last is not None and end is not None \
                and self.last.wait_s > self.delays[0]:
            # a short turn: its wait is longer than the framework's own, so it is waited here
            await asyncio.sleep(max(0.0, end.at + self.last.wait_s - time.perf_counter()))
        if self.vad is not None and self.vad.resuming:
            # the caller went on (on a busy host their START may still be on its way to
            # the framework, whose END-and-transcript decision came first): held, and
            # that START reopens the turn
            return GOING_ON
        return p

    @property
    def delays(self) -> tuple[float, float]:
        """(confident, in doubt) waits after the last speech sample, at this scale."""
        s = self.settings
        return s.min_endpointing_delay_s * self.scale, s.max_endpointing_delay_s * self.scale

    def wait_s(self, transcript: str, p: float, lo: float, hi: float) -> float:
        """The wait after the last speech sample a decision implies."""
        if p < THRESHOLD:
            return hi
        if len(_WORD.findall(transcript)) <= self.settings.short_turn_words:
            return max(lo, self.settings.short_turn_delay_s * self.scale)
        return lo

    def _audio(self) -> tuple[np.ndarray | None, float | None, asyncio.Future[float] | None]:
        """The VAD's audio of this silence (float32, 16 kHz), where its speech stopped,
        and the audio model's answer if it was asked at the VAD's end."""
        end = self.tracker.speech_end if self.tracker is not None else None
        if end is None or end.audio is None or time.perf_counter() - end.decided > AUDIO_FRESH_S:
            return None, None, None
        if self._early is not None and abs(self._early[0].at - end.at) < SAME_END_S:
            return self._early[1], end.audio_end_s, self._early[2]
        return smart_turn.to_16k(end.audio, end.rate), end.audio_end_s, None

    def _heard(self, transcript: str) -> Heard | None:
        """The ear's last final transcript, if it is how this turn's words end."""
        heard = getattr(self.ear, "last_heard", None)
        if heard is None or not heard.text.strip() \
                or not transcript.rstrip().endswith(heard.text.strip()):
            return None
        return heard

    async def p_end(self, transcript: str, audio: np.ndarray | None = None,
                    wait: tuple[float, float] | None = None) -> float:
        """How likely the turn is over; `audio`: the turn's (float32, 16 kHz), else the
        VAD's latest; `wait`: the (min, max) delays the decision is logged with."""
        stop_s = early = None
        if audio is None:
            audio, stop_s, early = self._audio()
        if self.utterances is not None:  # the turn waits this long anyway
            lo_s = wait[0] if wait else self.delays[0]
            transcript = await self.utterances.spoken(transcript, lo_s)
        view = TurnView(transcript, audio, early, self._heard(transcript))
        name = self.detector.name
        t0 = time.perf_counter()
        fallback = False
        try:
            p = await self.detector.p_end(view)
        except Exception as e:
            DETECTOR_ERRORS.labels(detector=name).inc()
            log.warning("end of turn: the %s detector failed (%s); the word rule this turn",
                        name, e)
            p, fallback = await self._words.p_end(view), True
        DETECTOR_SECONDS.labels(detector=name).observe(time.perf_counter() - t0)
        lo, hi = wait or self.delays
        DECISIONS.labels(detector=name, result="end" if p >= THRESHOLD
                         else "doubt" if p == EAR_UNSURE else "hold").inc()
        self.last = Decision(detector=name, transcript=transcript, p_end=p,
                             wait_s=self.wait_s(transcript, p, lo, hi), at=time.perf_counter(),
                             audio=view.audio, stop_s=stop_s, fallback=fallback)
        return p


def turn_detector(settings: AgentSettings,
                  tracker: TurnTracker | None = None) -> TurnEnd | TurnDetector | str:
    """AGENT_TURN_DETECTION as an AgentSession takes it: ours (`TurnEnd`), the framework's
    local text model ("model"), or "vad"."""
    if settings.turn_detection == "model":
        return TurnDetector(version="v1-mini", local_fallback=True)
    detector = make_detector(settings)
    return "vad" if detector is None else TurnEnd(settings, detector, tracker)


# semantic_vad's eagerness (the Realtime API): how soon a turn ends, as a scale on the
# agent's waits ("auto" and "medium": the agent's own).
EAGERNESS = {"low": 2.0, "medium": 1.0, "auto": 1.0, "high": 0.5}


def eagerness_scale(eagerness: str | None) -> float:
    return EAGERNESS.get(eagerness or "auto", 1.0)


def endpointing(settings: AgentSettings, eagerness: str | None = None) -> tuple[float, float]:
    """(min, max) wait after the last speech sample, scaled by a Realtime eagerness."""
    k = eagerness_scale(eagerness)
    return settings.min_endpointing_delay_s * k, settings.max_endpointing_delay_s * k
