"""The one place settings become a conversation's parts: the ear (STT), the thinker
(LLM), the voice (TTS) and the VAD, each reporting its moments to the conversation's
turn tracker; the end-of-turn detector (turn_end.py) and the policy around it
(`turn_handling`). Every door builds its
conversations here (`/v1/talk`, `/v1/realtime`, LiveKit rooms, direct mode), so a
setting changed once reaches them all.

Knows nothing of sockets, rooms or a door's wire.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from livekit.agents.inference.eot import TurnDetector

from ..bridge import BridgeConfig
from ..duplex import FRAMEWORK_NEVER_INTERRUPTS
from ..metrics import TurnTracker
from ..plugins import LLM, STT, TTS
from ..plugins.utterances import UtteranceStore
from ..quiet_logs import quiet_framework_warnings
from ..settings import AgentSettings
from ..speech_end import TimedVAD
from ..vad_batch import BatchedVAD
from .turn_end import TurnEnd, turn_detector

log = logging.getLogger("voice_agent.conversation")


@dataclass
class Parts:
    """A conversation's STT, LLM, TTS and VAD (the process's Silero model, its ends of
    speech located in the audio for the tracker)."""
    stt: STT
    llm: LLM
    tts: TTS
    vad: TimedVAD
    turn: TurnEnd | TurnDetector | str  # the end-of-turn detector (turn_end.py)

    async def aclose(self) -> None:
        for part in (self.stt, self.llm, self.tts):
            with contextlib.suppress(Exception):
                await part.aclose()


_VAD: dict[tuple[float, float, float], BatchedVAD] = {}


def load_vad(settings: AgentSettings) -> BatchedVAD:
    """Silero (ONNX, 512-sample windows at 16 kHz), loaded once per process per config; its
    streams, every conversation's, run their windows in one batch a hop (vad_batch.py)."""
    quiet_framework_warnings()  # its per-window "slower than realtime": see quiet_logs.py
    key = (settings.vad_min_speech_ms / 1000, settings.vad_silence_ms / 1000,
           settings.vad_activation_threshold)
    if key not in _VAD:
        vad = BatchedVAD.load(
            min_speech_duration=key[0], min_silence_duration=key[1],
            activation_threshold=key[2], sample_rate=16000,
        )
        assert isinstance(vad, BatchedVAD)
        _VAD[key] = vad
    return _VAD[key]


def build_parts(settings: AgentSettings, tracker: TurnTracker, *,
                sample_rate: int | None = None) -> Parts:
    """The parts of one conversation. `sample_rate`: the reply audio's, if the door fixes
    it (the Realtime API's 24 kHz); else AGENT_TTS_SAMPLE_RATE."""
    s = settings
    utterances = UtteranceStore(capacity=s.max_context_messages) if s.stt_mode == "audio" else None
    vad = TimedVAD(load_vad(s), tracker.vad_speech_ended, early_end=s.vad_end == "speech")
    stt_ = STT(addr=s.thinker_addr, instruction=s.stt_instruction, max_tokens=s.stt_max_tokens,
               backend=s.stt_backend, fallback=s.stt_fallback, vad=vad,
               sphinx_workers=s.stt_workers, offline_model=s.stt_offline_model,
               early_pass=s.stt_early_pass, preflight=s.stt_preflight, utterances=utterances,
               tracker=tracker,
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
    turn = turn_detector(s, tracker)
    if isinstance(turn, TurnEnd):
        turn.utterances = utterances  # audio mode: the words, as the ear says them
        turn.vad = vad  # a short turn's wait ends early if the caller goes on
        turn.ear = stt_  # how sure the ear was of the turn's last words
    return Parts(stt=stt_, llm=llm_, tts=tts_, vad=vad, turn=turn)


def turn_handling(settings: AgentSettings, turn: Any) -> dict[str, Any]:
    """The end-of-turn policy and the interruption rules, as an AgentSession takes them:
    the VAD's end of speech with the turn detector behind it, the endpointing delays,
    interruptions decided by the duplex controller (duplex.py), preemptive replies.
    `turn`: the conversation's detector (`Parts.turn`)."""
    s = settings
    return {
        "turn_detection": turn,
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
