"""The agent: our plugins + Silero VAD in an AgentSession, the duplex controller, fallback.

`build_pipeline(settings)` makes everything one conversation needs; the LiveKit
worker and the direct mode both start it, with a room or with our own audio I/O.

Turn handling is the framework's, configured for a voice call: the VAD's end of speech
with our text end-of-turn detector behind it (turn_words.py; no cloud turn detector),
interruptions decided by the duplex controller (speech over a reply pauses it;
backchannels resume it, other words cut it: duplex.py; the framework's own false-
interruption resume is off, it would resume only on no words at all), and
`max_unrecoverable_errors` raised so that a backend outage never closes the session:
`FallbackSpeaker` answers an STT/LLM/TTS failure with the short fallback phrase (from
the phrase cache, so it plays even when the TTS is the part that is down) or stays
silent, and the next turn tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from livekit import rtc
from livekit.agents import APIConnectOptions, llm
from livekit.agents.inference.eot import TurnDetector
from livekit.agents.voice import Agent, AgentSession
from livekit.agents.voice.agent_session import SessionConnectOptions
from livekit.agents.voice.events import (
    AgentStateChangedEvent,
    ConversationItemAddedEvent,
    ErrorEvent,
)

from .backchannel import BackchannelPolicy
from .conversation.parts import build_parts, turn_handling
from .conversation.turn_end import TurnEnd
from .duplex import DuplexController
from .metrics import CONVERSATIONS, TurnTracker
from .plugins import LLM, STT, TTS
from .settings import AgentSettings
from .speech_end import TimedVAD
from .tools import livekit_tools

log = logging.getLogger("voice_agent.agent")


def starter_phrases(settings: AgentSettings) -> list[str]:
    """The fixed phrases a session may speak: the greeting and the fallback."""
    return [x for x in (settings.greeting, settings.fallback_reply) if x]


class PhraseCache:
    """Synthesized audio of fixed phrases (greeting, fallback), made once per process.

    A cached phrase plays with no TTS round trip (first audio = the first frame read
    from memory) and still plays when the TTS is down."""

    def __init__(self) -> None:
        self._audio: dict[str, list[rtc.AudioFrame]] = {}
        self.synth_ms: dict[str, float] = {}

    async def warm(self, tts: TTS, phrases: list[str], timeout_s: float = 30.0) -> None:
        for phrase in phrases:
            if not phrase or phrase in self._audio:
                continue
            t0 = time.perf_counter()
            frames: list[rtc.AudioFrame] = []
            try:
                async with asyncio.timeout(timeout_s):
                    stream = tts.synthesize(
                        phrase, conn_options=APIConnectOptions(max_retry=0, timeout=timeout_s)
                    )
                    async with stream:
                        async for ev in stream:
                            frames.append(ev.frame)
            except Exception as e:  # no cache: the phrase goes through the TTS live
                log.warning("phrase cache: could not synthesize %r: %s", phrase, e)
                continue
            if frames:
                self._audio[phrase] = frames
                self.synth_ms[phrase] = (time.perf_counter() - t0) * 1000
                log.info("phrase cache: %r, %.2f s of audio in %.0f ms", phrase,
                         sum(f.duration for f in frames), self.synth_ms[phrase])

    def has(self, phrase: str) -> bool:
        return phrase in self._audio

    def audio(self, phrase: str) -> AsyncIterator[rtc.AudioFrame] | None:
        frames = self._audio.get(phrase)
        if frames is None:
            return None

        async def gen() -> AsyncIterator[rtc.AudioFrame]:
            for f in frames:
                yield f

        return gen()


# A door's say in a user turn the session has just ended (the Realtime API's items and
# create_response): called with the new message before it is added; it may raise
# StopResponse (the turn is kept by the door, not answered).
OnUserTurn = Callable[[llm.ChatMessage], Awaitable[None]]


class VoiceAgent(Agent):
    def __init__(self, settings: AgentSettings, cache: PhraseCache,
                 tracker: TurnTracker | None = None, on_user_turn: OnUserTurn | None = None,
                 ) -> None:
        # AGENT_TOOLS: livekit-agents runs them (with our timeout, filler, error result)
        super().__init__(instructions=settings.system_prompt, tools=livekit_tools(settings))
        self._settings = settings
        self._cache = cache
        self._tracker = tracker
        self._on_user_turn = on_user_turn

    async def on_enter(self) -> None:
        greeting = self._settings.greeting
        if greeting:
            audio = self._cache.audio(greeting) if self._settings.starter_cache else None
            if audio is not None:
                self.session.say(greeting, audio=audio)
            else:
                self.session.say(greeting)

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        if self._tracker is not None:  # the session's end-of-turn wait is over
            self._tracker.turn_decided()
        if self._on_user_turn is not None:
            await self._on_user_turn(new_message)
        # Bounded memory: the plugin sends a window; here the stored history is trimmed
        # too, so a long call does not grow without bound.
        limit = self._settings.max_context_messages
        if len(self.chat_ctx.items) > 2 * limit:
            ctx = self.chat_ctx.copy()
            ctx.truncate(max_items=limit)
            await self.update_chat_ctx(ctx)


class FallbackSpeaker:
    """On an unrecoverable STT/LLM/TTS error: say the fallback phrase once, or stay silent.

    An error of a preemptive reply (started while the user's turn was still open, agent
    state "listening") is answered when that turn is committed: speech started before
    the commit would be interrupted by it (the framework clears speech for a new turn).
    """

    def __init__(self, session: AgentSession, settings: AgentSettings, cache: PhraseCache,
                 tracker: TurnTracker) -> None:
        self._session = session
        self._settings = settings
        self._cache = cache
        self._tracker = tracker
        self._speaking_fallback = False
        self._pending: str | None = None  # component whose fallback waits for the commit
        self.events: list[str] = []  # what happened, for logs and tests
        session.on("error", self._on_error)
        session.on("conversation_item_added", self._on_item)

    def _on_error(self, ev: ErrorEvent) -> None:
        err = ev.error
        if getattr(err, "recoverable", False):
            return
        component = {"llm_error": "llm", "tts_error": "tts", "stt_error": "stt"}.get(
            getattr(err, "type", ""), "session")
        log.warning("%s failed, the session goes on: %s", component,
                    getattr(err, "error", err))
        if component in ("llm", "tts") and self._session.agent_state == "listening":
            self._pending = component
            return
        self._speak(component)

    def _on_item(self, ev: ConversationItemAddedEvent) -> None:
        if self._pending is not None and getattr(ev.item, "role", None) == "user":
            component, self._pending = self._pending, None
            self._speak(component)

    def _speak(self, component: str) -> None:
        if component == "session" or self._speaking_fallback:
            self.events.append(f"{component}:silent")
            return
        phrase = self._settings.fallback_reply
        audio = self._cache.audio(phrase) if phrase else None
        if not phrase or (audio is None and component == "tts"):
            self.events.append(f"{component}:silent")  # nothing to say it with
            return
        self.events.append(f"{component}:fallback")
        self._speaking_fallback = True
        try:
            handle = (self._session.say(phrase, audio=audio, add_to_chat_ctx=False) if audio
                      else self._session.say(phrase, add_to_chat_ctx=False))
            handle.add_done_callback(lambda _: setattr(self, "_speaking_fallback", False))
        except RuntimeError as e:
            self._speaking_fallback = False
            log.warning("fallback not spoken: %s", e)


@dataclass
class Pipeline:
    settings: AgentSettings
    session: AgentSession
    agent: VoiceAgent
    stt: STT
    llm: LLM
    tts: TTS
    tracker: TurnTracker
    cache: PhraseCache
    vad: TimedVAD  # this conversation's (its own options: a Realtime session's)
    turn: TurnEnd | TurnDetector | str  # the end-of-turn detector (its .last: the feedback's)
    fallback: FallbackSpeaker | None = None
    duplex: DuplexController | None = None


def build_pipeline(settings: AgentSettings, *, tracker: TurnTracker | None = None,
                   cache: PhraseCache | None = None, sample_rate: int | None = None,
                   on_user_turn: OnUserTurn | None = None) -> Pipeline:
    """One conversation's session and parts. `sample_rate`: the reply audio's, where the
    door fixes it (the Realtime API's 24 kHz); `on_user_turn`: see OnUserTurn."""
    tracker = tracker or TurnTracker()
    cache = cache or PhraseCache()
    s = settings
    parts = build_parts(s, tracker, sample_rate=sample_rate)
    # one try per call: a retry would only delay the fallback on a dead backend
    once = APIConnectOptions(max_retry=0, retry_interval=0.1, timeout=10.0)
    session: AgentSession = AgentSession(
        stt=parts.stt, llm=parts.llm, tts=parts.tts, vad=parts.vad,
        turn_handling=turn_handling(s, parts.turn),  # type: ignore[arg-type]
        conn_options=SessionConnectOptions(stt_conn_options=once, llm_conn_options=once,
                                           tts_conn_options=once,
                                           max_unrecoverable_errors=1_000_000),
        user_away_timeout=None,
        # No echo warm-up: the framework would feed the STT silence for the agent's first
        # 3 s of speech, and the duplex controller decides a paused reply by the words it
        # hears (a browser and a LiveKit client cancel echo themselves).
        aec_warmup_duration=None,
        **({} if s.tts_text_filters else {"tts_text_transforms": None}),
    )
    count_conversation(session)
    agent = VoiceAgent(s, cache, tracker, on_user_turn)
    p = Pipeline(settings=s, session=session, agent=agent, stt=parts.stt, llm=parts.llm,
                 tts=parts.tts, tracker=tracker, cache=cache, vad=parts.vad,
                 turn=parts.turn)
    p.fallback = FallbackSpeaker(session, s, cache, tracker)
    return p


def count_conversation(session: AgentSession) -> None:
    """agent_conversations_active: from the session's start (its first state after
    "initializing") to its close, whichever transport carries it."""
    counted = False

    def started(ev: AgentStateChangedEvent) -> None:
        nonlocal counted
        if ev.old_state == "initializing" and not counted:
            counted = True
            CONVERSATIONS.inc()

    def closed(_: object) -> None:
        nonlocal counted
        if counted:
            counted = False
            CONVERSATIONS.dec()

    session.on("agent_state_changed", started)
    session.on("close", closed)


def attach_duplex(p: Pipeline, *, silent_from: object = None,
                  reports_first_audio: bool = True) -> DuplexController:
    p.duplex = DuplexController(
        p.session, tracker=p.tracker, llm=p.llm, tts=p.tts,
        reports_first_audio=reports_first_audio,
        vad_silence_s=p.settings.vad_silence_ms / 1000,
        allow_interruptions=p.settings.allow_interruptions,
        silent_from=silent_from,  # type: ignore[arg-type]
        backchannel=BackchannelPolicy.parse(
            p.settings.backchannel_words, max_speech_s=p.settings.backchannel_max_ms / 1000,
            wait_s=p.settings.backchannel_wait_ms / 1000)
        if p.settings.backchannel_resume else None,
    )
    return p.duplex
