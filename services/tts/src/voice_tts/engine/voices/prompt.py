"""What a voice is, as data: the public `Voice` (a name and what it speaks), `VoicePrompt`
(what a library voice adds to a prompt: numpy, made once), and its device forms
(`LibraryVoice`, `IclPrompt`) and the `ResolvedVoice` a session carries."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..model_type import ModelType


class UnknownVoice(ValueError):
    """Unknown speaker or language (a ValueError: the server maps it to NOT_FOUND or
    INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Voice:
    name: str
    languages: tuple[str, ...]
    dialect: str | None = None
    kind: str = "preset"  # "preset" | "clone" | "design"


@dataclass(frozen=True)
class VoicePrompt:
    """What a library voice adds to a prompt, derived once when the voice is made."""

    x_vector: np.ndarray | None = None  # (talker hidden,) float32: Base clones
    ref_codes: np.ndarray | None = None  # (T_ref, 16) int64: in-context; None: x-vector only
    ref_text: str = ""  # the reference's transcript (in-context clones)
    instruct: str = ""  # VoiceDesign: the description

    @property
    def kind(self) -> str:
        return "design" if self.x_vector is None else "clone"

    def check(self, model_type: ModelType) -> None:
        """ValueError unless this prompt is whole and fits a checkpoint of `model_type`
        (clones need Base, designs VoiceDesign)."""
        if self.x_vector is None and not self.instruct.strip():
            raise ValueError("a voice prompt needs an x-vector (clone) or an instruct (design)")
        if self.x_vector is not None and self.instruct:
            raise ValueError("a voice prompt is a clone (x-vector) or a design (instruct), "
                             "not both")
        if self.ref_codes is not None and (self.ref_codes.ndim != 2 or not len(self.ref_codes)
                                           or not self.ref_text.strip()):
            raise ValueError("an in-context clone needs (T_ref, 16) reference codes and "
                             "their transcript")
        need = ModelType.for_voice_kind(self.kind)
        if model_type != need:
            raise ValueError(f"a {self.kind} voice needs a {need} checkpoint; this one is "
                             f"{model_type}")


@dataclass(frozen=True)
class IclPrompt:
    """An in-context clone's part of the prompt (device tensors, talker dtype)."""

    ref_ids: list[int]  # the transcript's text ids (Lr)
    codec_rows: torch.Tensor  # (T_ref, H): each reference frame's summed codec embeddings
    ref_codes: torch.Tensor  # (T_ref, 16) int64: primes the speech decoder
    # The speech decoder's state after the reference codes (`DecoderSlots.save`), kept at
    # first use: later utterances copy it in instead of decoding the reference again.
    decoder_state: list[torch.Tensor] = field(default_factory=list, compare=False,
                                              repr=False)

    @property
    def codec_len(self) -> int:
        """Ly: the codec track of the in-context part, bos + one row per frame."""
        return len(self.codec_rows) + 1


@dataclass(frozen=True)
class LibraryVoice:
    """A library voice as the prompt uses it (built once, by the engine)."""

    prompt: VoicePrompt
    speaker_vec: torch.Tensor | None = None  # (H,) the x-vector in the talker dtype
    icl: IclPrompt | None = None
    instruct_ids: list[int] | None = None  # VoiceDesign: the description's rows


@dataclass(frozen=True)
class ResolvedVoice:
    """Everything of a voice a session's prompts need: a preset speaker's codec id, or an
    x-vector (+ in-context rows), or a design's instruct rows (no speaker row)."""

    codec_prefix: list[int]
    speaker_id: int | None = None
    speaker_vec: torch.Tensor | None = None
    icl: IclPrompt | None = None
    instruct_ids: list[int] | None = None
    kind: str = "preset"
