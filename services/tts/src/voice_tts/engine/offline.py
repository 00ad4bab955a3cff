"""Whole text in, whole utterance out: the offline helper (`Engine.synthesize`), through
the same session path as streaming."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import numpy as np

from .api import AudioPacket, SessionParams, UtteranceEnd
from .config import ModelConfig
from .faults import EngineFailed
from .sampling import SamplingParams
from .session import Session, Sink


class Steppable(Protocol):
    """What of the engine this helper uses (the engine imports this module, not back)."""

    cfg: ModelConfig
    fatal: BaseException | None

    @property
    def running(self) -> bool: ...

    def open_session(self, params: SessionParams, sink: Sink) -> Session: ...

    def run_once(self) -> bool: ...


def synthesize(engine: Steppable, text: str, voice: str, language: str = "auto", seed: int = 0,
               sampling: SamplingParams | None = None, instruct: str = "",
               non_streaming_mode: bool = False, max_frames: int | None = None,
               return_codes: bool = False, max_text_chars: int = 4000,
               timeout: float = 600.0):
    """Float32 PCM at 24 kHz; with `return_codes`, (pcm, codes (frames, 16)). Steps the
    engine itself unless its thread runs."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text is empty")
    if len(text) > max_text_chars:
        raise ValueError(f"text over the limit of {max_text_chars} characters")
    packets: list[AudioPacket] = []
    done = threading.Event()
    end: list[UtteranceEnd] = []

    def sink(event: Any) -> None:
        if isinstance(event, AudioPacket):
            packets.append(event)
        else:
            end.append(event)
            done.set()

    params = SessionParams(voice=voice, language=language, instruct=instruct, seed=seed,
                           sampling=sampling or SamplingParams(),
                           max_text_chars=max_text_chars,
                           non_streaming_mode=non_streaming_mode, max_frames=max_frames)
    session = engine.open_session(params, sink)
    try:
        session.push_text(text)
        session.flush()
        threaded = engine.running
        deadline = time.monotonic() + timeout
        while not done.is_set():
            if engine.fatal is not None:
                raise EngineFailed(f"engine stopped after a fatal fault: {engine.fatal}")
            if time.monotonic() > deadline:
                raise TimeoutError("synthesis timed out")
            if threaded:
                done.wait(0.05)
            else:
                engine.run_once()
    finally:
        session.close()
    pcm = (np.concatenate([p.pcm for p in packets]) if packets
           else np.zeros(0, dtype=np.float32))
    if not return_codes:
        return pcm
    codes = (np.concatenate([p.codes for p in packets]) if packets
             else np.zeros((0, engine.cfg.code_predictor.num_code_groups), dtype=np.int64))
    return pcm, codes
