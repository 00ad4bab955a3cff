"""An engine's voices, as the server sees them: which kinds it speaks and makes, its voices
and languages, and library voices made, added and removed. All of it is the table's and
the maker's (this room); `Engine` takes it in (`class Engine(EngineVoices)`), and
`EngineSet` answers the same questions for several engines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import ModelConfig
from ..model_type import ModelType
from .making import VoiceMaker
from .prompt import Voice, VoicePrompt
from .table import VoiceTable


class EngineVoices:
    cfg: ModelConfig
    voice_table: VoiceTable
    voice_maker: VoiceMaker

    @property
    def model_type(self) -> ModelType:
        """Base (cloned voices), CustomVoice (presets) or VoiceDesign (described voices)."""
        return self.cfg.tts_model_type

    @property
    def can_clone(self) -> bool:
        """Makes voices from reference audio: a Base checkpoint."""
        return self.cfg.can_clone

    def makes(self, kind: str) -> bool:
        """Whether it makes (and speaks) library voices of `kind`: "clone", "design"."""
        return self.model_type.makes_voices and self.model_type.voice_kind == kind

    def maker_for(self, kind: str) -> Any:
        """The engine that makes voices of `kind` (this one or none; `EngineSet`: several)."""
        return self if self.makes(kind) else None

    @property
    def members(self) -> list[Any]:
        """The engines behind this one (`EngineSet` has several)."""
        return [self]

    def voices(self) -> list[Voice]:
        """Presets (CustomVoice) and the library voices added with `add_voice`."""
        return self.voice_table.voices()

    def make_voice_prompt(self, audio: np.ndarray, sample_rate: int, ref_text: str = "",
                          x_vector_only: bool = False) -> VoicePrompt:
        """A clone of a reference recording (Base checkpoints): `VoiceMaker.from_audio`."""
        return self.voice_maker.from_audio(audio, sample_rate, ref_text, x_vector_only)

    def design_voice_prompt(self, description: str) -> VoicePrompt:
        """A designed voice (VoiceDesign checkpoints): the description is its instruct."""
        return self.voice_maker.from_description(description)

    def add_voice(self, name: str, prompt: VoicePrompt) -> None:
        """Add (or replace) a library voice; sessions name it like a preset. ValueError:
        a preset's name, or a prompt of another model type."""
        self.voice_table.add(name, self.voice_maker.library_voice(prompt))

    def remove_voice(self, name: str) -> None:
        """Remove a library voice (UnknownVoice if none); open sessions keep theirs."""
        self.voice_table.remove(name)

    def languages(self) -> list[str]:
        return self.voice_table.languages()
