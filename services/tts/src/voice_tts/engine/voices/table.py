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

from ..config import TalkerConfig
from ..model_type import ModelType
from .prompt import LibraryVoice, ResolvedVoice, UnknownVoice, Voice


class VoiceNames:
    """The one rule for naming a voice and a language, for the server's config check and
    the engine's sessions alike: case-insensitive, surrounding spaces ignored, empty
    language = "auto"; an unknown name raises UnknownVoice naming the known ones."""

    def __init__(self, speakers: Iterable[str], languages: Iterable[str]) -> None:
        self.speakers = sorted(name.lower() for name in speakers)
        self.languages = [lang.lower() for lang in languages]

    def __call__(self, voice: str, language: str) -> tuple[str, str]:
        """-> (speaker, language) as the table spells them."""
        name = (voice or "").strip().lower()
        if name not in self.speakers:
            raise UnknownVoice(f"unknown voice {(voice or '')[:64]!r}; known: {self.speakers}")
        return name, self.language(language)

    def language(self, language: str) -> str:
        """The language as the table spells it (UnknownVoice if none)."""
        lang = (language or "auto").strip().lower()
        if lang not in self.languages:
            raise UnknownVoice(f"unknown language {(language or '')[:64]!r}; "
                               f"known: {self.languages}")
        return lang


def voice_named(voices: Iterable[Voice], name: str) -> Voice:
    """The voice of that name (the naming rule's spelling), or UnknownVoice."""
    key = (name or "").strip().lower()
    for v in voices:
        if v.name == key:
            return v
    raise UnknownVoice(f"unknown voice {(name or '')[:64]!r}")


class VoiceTable:
    """Presets (CustomVoice checkpoints only) and library voices, by lower-case name."""

    def __init__(self, cfg: TalkerConfig,
                 model_type: ModelType = ModelType.CUSTOM_VOICE) -> None:
        self.cfg, self.model_type = cfg, ModelType.parse(model_type)
        presets = cfg.spk_id if self.model_type.voice_kind == "preset" else {}
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

    def voice(self, name: str) -> Voice:
        return voice_named(self.voices(), name)

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
        if library is not None:
            return self._resolve_library(library, lang)
        lang_id = None if lang == "auto" else self.language_ids[lang]
        dialect = self.dialects.get(name)
        if lang in ("chinese", "auto") and dialect:
            lang_id = self.language_ids[str(dialect).lower()]
        return ResolvedVoice(self._prefix(lang_id), speaker_id=self.speakers[name])

    def resolve_prompt(self, library: LibraryVoice, language: str) -> ResolvedVoice:
        """A voice that is in no table: one session's own (inline reference audio)."""
        return self._resolve_library(library, self.names.language(language))

    def _resolve_library(self, library: LibraryVoice, lang: str) -> ResolvedVoice:
        lang_id = None if lang == "auto" else self.language_ids[lang]
        return ResolvedVoice(self._prefix(lang_id), speaker_vec=library.speaker_vec,
                             icl=library.icl, instruct_ids=library.instruct_ids,
                             kind=library.prompt.kind)

    def _prefix(self, lang_id: int | None) -> list[int]:
        c = self.cfg
        return ([c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
                if lang_id is None else
                [c.codec_think_id, c.codec_think_bos_id, lang_id, c.codec_think_eos_id])
