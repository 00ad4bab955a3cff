"""Qwen3-TTS-12Hz CustomVoice inference for streaming text and continuous batching.

Layers (each knows only the one below): `engine` (sessions, the loop) -> `scheduler`
(who runs, plain data) + `runner` (tensors, caches, the steps) -> `model/` (modules).
`text` turns streamed UTF-8 into stable token ids; `checkpoint` reads the official layout.
"""

from .api import (
    AudioPacket,
    EngineFull,
    EngineSettings,
    SessionParams,
    StepStats,
    UtteranceEnd,
)
from .engine import Engine
from .faults import EngineFailed
from .sampling import SamplingParams
from .session import Session
from .voices import UnknownVoice, Voice

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
]
