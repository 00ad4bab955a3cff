"""Qwen3-TTS-12Hz inference for streaming text and continuous batching: CustomVoice
(preset speakers), Base (cloned voices) and VoiceDesign (described voices).

Layers (each knows only the one below): `engine` (the loop: schedule -> execute ->
update) -> `scheduler` (sessions, who runs, who ends: plain data) + `output` (packets and
ends to the sinks) + `runner` (tensors, caches, the steps) -> `model/` (modules).
`session` is the streaming API a client holds; `text` turns streamed UTF-8 into stable
token ids (and owns the prompt's role/text split); `voices` names speakers, library
voices (`VoicePrompt`) and languages; `checkpoint` reads the official layout.
"""

from .api import (
    AudioPacket,
    EngineFull,
    EngineSettings,
    SessionParams,
    StepStats,
    UtteranceEnd,
    to_s16,
)
from .engine import Engine
from .faults import EngineFailed
from .sampling import SamplingParams
from .session import Session
from .voices import UnknownVoice, Voice, VoiceNames, VoicePrompt

__all__ = [
    "AudioPacket",
    "Engine",
    "EngineFailed",
    "EngineFull",
    "EngineSettings",
    "SamplingParams",
    "Session",
    "SessionParams",
    "StepStats",
    "UnknownVoice",
    "UtteranceEnd",
    "Voice",
    "VoiceNames",
    "VoicePrompt",
    "to_s16",
]
