"""The checkpoint type, config.json's `tts_model_type`, and the voices each type speaks.

The one home of the type: `ModelConfig` holds a `ModelType`, the checkpoint loader
accepts only these, and the voices code asks `voice_kind` / `for_voice_kind` which
checkpoint speaks (and makes) which kind of voice. A `StrEnum`: it compares, formats and
serialises as the official string ("base" == ModelType.BASE).
"""

from __future__ import annotations

from enum import StrEnum


class ModelType(StrEnum):
    # In this order: the loader's "supported: ..." message lists them so.
    CUSTOM_VOICE = "custom_voice"  # CustomVoice: speaks its preset speakers
    BASE = "base"  # Base: clones voices from reference audio (speaker encoder)
    VOICE_DESIGN = "voice_design"  # VoiceDesign: speaks voices made from a description

    @classmethod
    def parse(cls, value: object, where: str = "") -> ModelType:
        """`value` as a ModelType; ValueError naming the supported ones otherwise."""
        if value in tuple(cls):
            return cls(value)
        at = f" in {where}" if where else ""
        raise ValueError(f"unknown tts_model_type {value!r}{at}; "
                         f"supported: {', '.join(cls)}")

    @classmethod
    def for_voice_kind(cls, kind: str) -> ModelType:
        """The checkpoint type that speaks voices of `kind` ("preset", "clone", "design")."""
        for t, k in VOICE_KINDS.items():
            if k == kind:
                return t
        raise ValueError(f"unknown voice kind {kind!r}; known: {', '.join(VOICE_KINDS.values())}")

    @property
    def voice_kind(self) -> str:
        """The kind of voice a checkpoint of this type speaks (`Voice.kind`)."""
        return VOICE_KINDS[self]

    @property
    def makes_voices(self) -> bool:
        """Makes library voices at run time (clones, designs); CustomVoice has presets."""
        return self is not ModelType.CUSTOM_VOICE

    @property
    def label(self) -> str:
        """The official checkpoint name's part: "CustomVoice", "Base", "VoiceDesign"."""
        return _LABELS[self]


# The one mapping from checkpoint type to the voices it speaks.
VOICE_KINDS: dict[ModelType, str] = {
    ModelType.CUSTOM_VOICE: "preset",
    ModelType.BASE: "clone",
    ModelType.VOICE_DESIGN: "design",
}
_LABELS: dict[ModelType, str] = {
    ModelType.CUSTOM_VOICE: "CustomVoice",
    ModelType.BASE: "Base",
    ModelType.VOICE_DESIGN: "VoiceDesign",
}
