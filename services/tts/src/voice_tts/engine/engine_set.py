"""Several checkpoints behind one server, one voice namespace: `TTS_MODEL=a,b,...`.

No official Qwen3-TTS checkpoint does everything: CustomVoice speaks presets (with
instructions), Base clones reference audio, VoiceDesign speaks described voices. An
`EngineSet` holds one `Engine` of each kind it is given and looks like one engine to the
server: `voices()` is their catalogue merged (each voice with its kind), a session goes to
the engine that owns its voice, a clone is made (and stored) by the engine that clones, a
design by the one that designs. Each engine keeps its own thread, caches and graphs (on
a GPU they share it; their memory adds up: README, "Several checkpoints").

Admission sees every engine's steps through one `on_step` hook; each engine refuses past
its own `max_sessions` (EngineFull).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .api import SessionParams
from .engine import Engine
from .model_type import ModelType
from .session import Session, Sink
from .text import TextTokenizer
from .voices import Voice, VoiceNames, VoicePrompt
from .voices.table import voice_named

log = logging.getLogger(__name__)


class MergedVoiceTable:
    """The server's view of the voices of several engines: one naming rule over all."""

    def __init__(self, engines: list[Engine]) -> None:
        self._engines = engines

    @property
    def names(self) -> VoiceNames:
        speakers = [n for e in self._engines for n in e.voice_table.names.speakers]
        return VoiceNames(speakers, _languages(self._engines))

    def voices(self) -> list[Voice]:
        seen: dict[str, Voice] = {}
        for e in self._engines:
            for v in e.voice_table.voices():
                seen.setdefault(v.name, v)
        return sorted(seen.values(), key=lambda v: (v.kind != "preset", v.name))

    def voice(self, name: str) -> Voice:
        return voice_named(self.voices(), name)

    def languages(self) -> list[str]:
        return _languages(self._engines)

    def owner(self, name: str) -> Engine:
        """The engine that speaks the voice called `name` (UnknownVoice if none)."""
        key = (name or "").strip().lower()
        for e in self._engines:
            if key in e.voice_table.names.speakers:
                return e
        return self._engines[0]  # it raises UnknownVoice with the known names


def _languages(engines: Iterable[Engine]) -> list[str]:
    out: list[str] = []
    for e in engines:
        out += [lang for lang in e.languages() if lang not in out]
    return out


class _OnEvery:
    """A hook of the set is the same hook on every engine."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: EngineSet | None, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.engines[0], self.name)

    def __set__(self, obj: EngineSet, hook: Callable[..., None] | None) -> None:
        for e in obj.engines:
            setattr(e, self.name, hook)


class EngineSet:
    """One engine per checkpoint kind, routed by voice (module docstring)."""

    def __init__(self, engines: list[Engine]) -> None:
        if not engines:
            raise ValueError("an EngineSet needs at least one engine")
        kinds = [e.model_type for e in engines]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"one checkpoint of each kind, got {kinds}")
        first = engines[0]
        for e in engines[1:]:
            if (e.sample_rate, e.frame_samples, e.device) != (
                    first.sample_rate, first.frame_samples, first.device):
                raise ValueError(f"{e.model_name} and {first.model_name} differ in sample "
                                 "rate, frame size or device")
        self.engines = engines
        self.voice_table = MergedVoiceTable(engines)
        # the same on every engine (checked above)
        self.sample_rate, self.frame_samples = first.sample_rate, first.frame_samples
        self.device = first.device

    # --- what the server reads ---------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return "+".join(e.model_name for e in self.engines)

    @property
    def members(self) -> list[Engine]:
        return self.engines

    @property
    def tokenizer(self) -> TextTokenizer:
        """The first engine's: every Qwen3-TTS checkpoint has the same Qwen2 text tokenizer
        (the OpenAI front counts a request's tokens with it)."""
        return self.engines[0].tokenizer

    @property
    def bucket_step_ms(self) -> dict[int, float]:
        """Each bucket's slowest engine: admission's capacity model starts there."""
        out: dict[int, float] = {}
        for e in self.engines:
            for b, ms in e.bucket_step_ms.items():
                out[b] = max(ms, out.get(b, 0.0))
        return out

    on_step = _OnEvery()  # called from each engine's thread with its StepStats
    on_fatal = _OnEvery()

    @property
    def fatal(self) -> BaseException | None:
        return next((e.fatal for e in self.engines if e.fatal is not None), None)

    @property
    def can_clone(self) -> bool:
        return any(e.can_clone for e in self.engines)

    def maker_for(self, kind: str) -> Engine | None:
        return next((e for e in self.engines if e.makes(kind)), None)

    def voices(self) -> list[Voice]:
        return self.voice_table.voices()

    def languages(self) -> list[str]:
        return self.voice_table.languages()

    # --- voices ------------------------------------------------------------------------------
    def _maker(self, kind: str) -> Engine:
        e = self.maker_for(kind)
        if e is None:
            need = ModelType.for_voice_kind(kind).label
            raise ValueError(f"no checkpoint here makes a {kind} voice (a {need} one does)")
        return e

    def make_voice_prompt(self, audio: np.ndarray, sample_rate: int, ref_text: str = "",
                          x_vector_only: bool = False) -> VoicePrompt:
        return self._maker("clone").make_voice_prompt(audio, sample_rate, ref_text,
                                                      x_vector_only)

    def design_voice_prompt(self, description: str) -> VoicePrompt:
        return self._maker("design").design_voice_prompt(description)

    def add_voice(self, name: str, prompt: VoicePrompt) -> None:
        """Into the engine that speaks its kind; a name taken by another engine's preset
        or voice is refused (ValueError), so one name is one voice."""
        target = self._maker(prompt.kind)
        key = name.strip().lower()
        for e in self.engines:
            if e is not target and key in e.voice_table.names.speakers:
                raise ValueError(f"{name!r} is already a voice of {e.model_name}")
        target.add_voice(name, prompt)

    def remove_voice(self, name: str) -> None:
        self.voice_table.owner(name).remove_voice(name)

    # --- sessions and the loop ---------------------------------------------------------------
    def open_session(self, params: SessionParams, sink: Sink) -> Session:
        if params.voice_prompt is not None:
            return self._maker(params.voice_prompt.kind).open_session(params, sink)
        return self.voice_table.owner(params.voice).open_session(params, sink)

    def start(self) -> None:
        for e in self.engines:
            e.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        for e in self.engines:
            e.shutdown(timeout)

    def stalled_for(self) -> float:
        return max(e.stalled_for() for e in self.engines)
