"""The one place settings become a conversation's parts: the ear (STT), the thinker
(LLM), the voice (TTS) and the VAD, each reporting its moments to the conversation's
turn tracker; and the end-of-turn policy (`turn_handling`). Every door builds its
conversations here (`/v1/talk`, `/v1/realtime`, LiveKit rooms, direct mode), so a
setting changed once reaches them all.

Knows nothing of sockets, rooms or a door's wire.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from livekit.agents import llm
from livekit.agents.inference.eot import TurnDetector
from livekit.plugins import silero

from ..bridge import BridgeConfig
from ..duplex import FRAMEWORK_NEVER_INTERRUPTS
from ..metrics import TurnTracker
from ..plugins import LLM, STT, TTS
from ..plugins.utterances import UtteranceStore
from ..quiet_logs import quiet_framework_warnings
from ..settings import AgentSettings
from ..speech_end import TimedVAD
from ..turn_words import TrailingWordTurnDetector

log = logging.getLogger("voice_agent.conversation")


@dataclass
class Parts:
    """A conversation's STT, LLM, TTS and VAD (the process's Silero model, its ends of
    speech located in the audio for the tracker)."""
    stt: STT
    llm: LLM
    tts: TTS
    vad: TimedVAD

    async def aclose(self) -> None:
        for part in (self.stt, self.llm, self.tts):
            with contextlib.suppress(Exception):
                await part.aclose()


_VAD: dict[tuple[float, float, float], silero.VAD] = {}


def load_vad(settings: AgentSettings) -> silero.VAD:
    """Silero (ONNX, 512-sample windows at 16 kHz), loaded once per process per config."""
    quiet_framework_warnings()  # its per-window "slower than realtime": see quiet_logs.py
    key = (settings.vad_min_speech_ms / 1000, settings.vad_silence_ms / 1000,
           settings.vad_activation_threshold)
    if key not in _VAD:
        _VAD[key] = silero.VAD.load(
            min_speech_duration=key[0], min_silence_duration=key[1],
            activation_threshold=key[2], sample_rate=16000,
        )
    return _VAD[key]


def build_parts(settings: AgentSettings, tracker: TurnTracker, *,
                sample_rate: int | None = None) -> Parts:
    """The parts of one conversation. `sample_rate`: the reply audio's, if the door fixes
    it (the Realtime API's 24 kHz); else AGENT_TTS_SAMPLE_RATE."""
    s = settings
    utterances = UtteranceStore(capacity=s.max_context_messages) if s.stt_mode == "audio" else None
    vad = TimedVAD(load_vad(s), tracker.vad_speech_ended)
    stt_ = STT(addr=s.thinker_addr, instruction=s.stt_instruction, max_tokens=s.stt_max_tokens,
               backend=s.stt_backend, fallback=s.stt_fallback, vad=vad,
               sphinx_workers=s.stt_workers, offline_model=s.stt_offline_model,
               early_pass=s.stt_early_pass, utterances=utterances, tracker=tracker,
               api_key=s.llm_api_key.get_secret_value())
    llm_ = LLM(addr=s.thinker_addr, max_tokens=s.llm_max_tokens, temperature=s.llm_temperature,
               max_messages=s.max_context_messages, seed=s.llm_seed, utterances=utterances,
               tracker=tracker, api_key=s.llm_api_key.get_secret_value())
    bridge = BridgeConfig(starter_min_chars=s.bridge_starter_min_chars,
                          starter_max_chars=s.bridge_starter_max_chars,
                          min_chars=s.bridge_min_chars, max_chars=s.bridge_max_chars)
    tts_ = TTS(addr=s.tts_addr, voice=s.tts_voice, language=s.tts_language,
               sample_rate=sample_rate or s.tts_sample_rate, frame_ms=s.tts_frame_ms,
               seed=s.tts_seed, max_frames=s.tts_max_frames, bridge=bridge,
               flush_on_sentence=s.bridge_flush_on_sentence, tracker=tracker,
               api_key=s.tts_api_key.get_secret_value())
    return Parts(stt=stt_, llm=llm_, tts=tts_, vad=vad)


def turn_detector(mode: str) -> TurnDetector | TrailingWordTurnDetector | str:
    """AGENT_TURN_DETECTION as the session takes it: a detector behind the VAD (the
    framework's local audio model, weights in livekit-local-inference, or ours on the
    transcript's last word), or "vad"."""
    if mode == "model":
        return TurnDetector(version="v1-mini", local_fallback=True)
    return TrailingWordTurnDetector() if mode == "text" else "vad"


def turn_handling(settings: AgentSettings) -> dict[str, Any]:
    """The end-of-turn policy and the interruption rules, as an AgentSession takes them:
    the VAD's end of speech with the turn detector behind it, the endpointing delays,
    interruptions decided by the duplex controller (duplex.py), preemptive replies."""
    s = settings
    return {
        "turn_detection": turn_detector(s.turn_detection),
        "endpointing": {"mode": "fixed", "min_delay": s.min_endpointing_delay_s,
                        "max_delay": s.max_endpointing_delay_s},
        "interruption": {"enabled": s.allow_interruptions, "mode": "vad",
                         "min_duration": s.min_interruption_ms / 1000,
                         # the duplex controller decides what cuts a reply
                         "min_words": FRAMEWORK_NEVER_INTERRUPTS
                         if s.backchannel_resume else 0,
                         "resume_false_interruption": False,
                         "false_interruption_timeout": None},
        "preemptive_generation": {"enabled": s.preemptive_generation,
                                  "preemptive_tts": s.preemptive_tts},
    }


async def end_of_turn_wait(settings: AgentSettings, detector: Any, transcript: str) -> float:
    """After the user's last speech sample, how long the turn stays open for them to go on:
    the same rule an AgentSession applies with `turn_handling` (min_endpointing_delay_s
    when the detector finds the end likely, max_endpointing_delay_s when it does not),
    for a door that runs its own turns (the Realtime API's server VAD)."""
    s = settings
    if isinstance(detector, str):  # "vad": silence alone
        return s.min_endpointing_delay_s
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content=transcript)
    try:
        p = await detector.predict_end_of_turn(ctx)
        threshold = await detector.unlikely_threshold(None)
    except Exception as e:  # a model that fails: the silence rule, this turn
        log.warning("end of turn: %s failed (%s); the silence rule this turn",
                    getattr(detector, "model", detector), e)
        return s.min_endpointing_delay_s
    unlikely = threshold is not None and p < threshold
    return s.max_endpointing_delay_s if unlikely else s.min_endpointing_delay_s
