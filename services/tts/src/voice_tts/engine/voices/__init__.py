"""The engine's room for voices: what a voice is (`prompt`: `Voice`, `VoicePrompt` and its
device forms), the one naming rule and the table of presets and library voices (`table`),
and making a prompt from reference audio or a description (`making`: `VoiceMaker`); what
an engine answers about its voices (`engine_voices`: `EngineVoices`, the engine's face).

A session carries its `ResolvedVoice`; a library voice is in the table by name, a voice
for one session (inline reference audio) is resolved from its prompt and never enters
the table.
"""

from .making import VoiceMaker, icl_codec_rows, resample_24k
from .prompt import (
    IclPrompt,
    LibraryVoice,
    ResolvedVoice,
    UnknownVoice,
    Voice,
    VoicePrompt,
)
from .table import VoiceNames, VoiceTable

__all__ = [
    "IclPrompt",
    "LibraryVoice",
    "ResolvedVoice",
    "UnknownVoice",
    "Voice",
    "VoiceMaker",
    "VoiceNames",
    "VoicePrompt",
    "VoiceTable",
    "icl_codec_rows",
    "resample_24k",
]
