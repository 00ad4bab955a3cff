"""Speakers and languages, resolved exactly as the official CustomVoice code does.

- speakers: `talker_config.spk_id` (names compared lower-case);
- languages: "auto" plus every `codec_language_id` key without "dialect" in its name;
- "auto" -> no language id in the codec prefix ([nothink, think_bos, think_eos]); a
  language -> [think, think_bos, <language id>, think_eos];
- dialect rule: a speaker with `spk_is_dialect[name]` set, asked for "chinese" or "auto",
  speaks its dialect's language id instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .config import TalkerConfig


class UnknownVoice(ValueError):
    """Unknown speaker or language (a ValueError: the server maps it to NOT_FOUND or
    INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Voice:
    name: str
    languages: tuple[str, ...]
    dialect: str | None = None


@dataclass(frozen=True)
class ResolvedVoice:
    speaker_id: int
    codec_prefix: list[int]


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
    def __init__(self, cfg: TalkerConfig) -> None:
        self.cfg = cfg
        self.speakers = {k.lower(): v for k, v in cfg.spk_id.items()}
        self.dialects = {k.lower(): v for k, v in cfg.spk_is_dialect.items()}
        self.language_ids = {k.lower(): v for k, v in cfg.codec_language_id.items()}
        self._languages = ["auto"] + [k for k in self.language_ids if "dialect" not in k]
        self.names = VoiceNames(self.speakers, self._languages)

    def languages(self) -> list[str]:
        return list(self._languages)

    def voices(self) -> list[Voice]:
        return [Voice(name, tuple(self._languages), self.dialects.get(name) or None)
                for name in sorted(self.speakers)]

    def resolve(self, voice: str, language: str) -> ResolvedVoice:
        name, lang = self.names(voice, language)
        lang_id = None if lang == "auto" else self.language_ids[lang]
        dialect = self.dialects.get(name)
        if lang in ("chinese", "auto") and dialect:
            lang_id = self.language_ids[str(dialect).lower()]
        c = self.cfg
        prefix = ([c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
                  if lang_id is None else
                  [c.codec_think_id, c.codec_think_bos_id, lang_id, c.codec_think_eos_id])
        return ResolvedVoice(self.speakers[name], prefix)
