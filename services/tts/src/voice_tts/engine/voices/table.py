"""Speakers and languages, resolved exactly as the official code does.

- preset speakers (CustomVoice only): `talker_config.spk_id` (names compared lower-case);
- library voices, added at run time (`VoiceTable.add`): clones of a reference recording
  (Base: an x-vector, plus the reference's codes and transcript for in-context cloning)
  and designed voices (VoiceDesign: a description, the instruct);
- languages: "auto" plus every `codec_language_id` key without "dialect" in its name;
- "auto" -> no language id in the codec prefix ([nothink, think_bos, think_eos]); a
  language -> [think, think_bos, <language id>, think_eos];
- dialect rule (presets only): a speaker with `spk_is_dialect[name]` set, asked for
  "chinese" or "auto", speaks its dialect's language id instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import TalkerConfig

MODEL_TYPES = ("base", "custom_voice", "voice_design")


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

    def check(self, model_type: str) -> None:
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
        need = "base" if self.kind == "clone" else "voice_design"
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


class VoiceNames:
    """The one rule for naming a voice and a language, for the server's config check and
    the engine's sessions alike: case-insensitive, surrounding spaces ignored, empty
    language = "auto"; an unknown name raises UnknownVoice naming the known ones."""

    def __init__(self, speakers: Iterable[str], languages: Iterable[str]) -> None:
        self.speakers = sorted(name.lower() for name in speakers)
        self.languages = [lang.lower() for lang in languages]

    def __call__(self, voice: str, language: str) -> tuple[str, str]:
        """-> (speaker, language) as the table spells them."""
        name, lang = (voice or "").strip().lower(), (language or "auto").strip().lower()
        if name not in self.speakers:
            raise UnknownVoice(f"unknown voice {(voice or '')[:64]!r}; known: {self.speakers}")
        if lang not in self.languages:
            raise UnknownVoice(f"unknown language {(language or '')[:64]!r}; "
                               f"known: {self.languages}")
        return name, lang


class VoiceTable:
    """Presets (CustomVoice checkpoints only) and library voices, by lower-case name."""

    def __init__(self, cfg: TalkerConfig, model_type: str = "custom_voice") -> None:
        self.cfg, self.model_type = cfg, model_type
        presets = cfg.spk_id if model_type == "custom_voice" else {}
        self.speakers = {k.lower(): v for k, v in presets.items()}
        self.dialects = {k.lower(): v for k, v in cfg.spk_is_dialect.items()}
        self.language_ids = {k.lower(): v for k, v in cfg.codec_language_id.items()}
        self._languages = ["auto"] + [k for k in self.language_ids if "dialect" not in k]
        self._library: dict[str, LibraryVoice] = {}
        self._lock = threading.Lock()
        self.names = VoiceNames(self.speakers, self._languages)

    def languages(self) -> list[str]:
        return list(self._languages)

    def voices(self) -> list[Voice]:
        langs = tuple(self._languages)
        with self._lock:
            library = sorted(self._library.items())
        return ([Voice(name, langs, self.dialects.get(name) or None)
                 for name in sorted(self.speakers)]
                + [Voice(name, langs, None, v.prompt.kind) for name, v in library])

    def add(self, name: str, voice: LibraryVoice) -> None:
        """Add or replace a library voice; a preset's name is refused (ValueError)."""
        key = name.strip().lower()
        if not key:
            raise ValueError("a voice needs a name")
        if key in self.speakers:
            raise ValueError(f"{name!r} is a preset voice's name")
        voice.prompt.check(self.model_type)
        with self._lock:
            self._library[key] = voice
            self._rename()

    def remove(self, name: str) -> None:
        key = (name or "").strip().lower()
        with self._lock:
            if self._library.pop(key, None) is None:
                raise UnknownVoice(f"unknown library voice {name[:64]!r}")
            self._rename()

    def _rename(self) -> None:
        self.names = VoiceNames([*self.speakers, *self._library], self._languages)

    def resolve(self, voice: str, language: str) -> ResolvedVoice:
        with self._lock:  # a voice removed meanwhile is unknown, not half-resolved
            name, lang = self.names(voice, language)
            library = self._library.get(name)
        lang_id = None if lang == "auto" else self.language_ids[lang]
        if library is not None:
            return ResolvedVoice(self._prefix(lang_id), speaker_vec=library.speaker_vec,
                                 icl=library.icl, instruct_ids=library.instruct_ids,
                                 kind=library.prompt.kind)
        dialect = self.dialects.get(name)
        if lang in ("chinese", "auto") and dialect:
            lang_id = self.language_ids[str(dialect).lower()]
        return ResolvedVoice(self._prefix(lang_id), speaker_id=self.speakers[name])

    def _prefix(self, lang_id: int | None) -> list[int]:
        c = self.cfg
        return ([c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
                if lang_id is None else
                [c.codec_think_id, c.codec_think_bos_id, lang_id, c.codec_think_eos_id])
