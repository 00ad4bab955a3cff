"""The seed team's regression gates, on the tiny preset: determinism, streaming ==
offline, duration, no empty audio, the max-length guard."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import torch
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineSettings,
    SamplingParams,
    SessionParams,
    UtteranceEnd,
)
from voice_tts.engine.length_guard import TextLength, max_frames_for

from .lib import snr_db

TEXT = "Real-time voice agents speak while the language model is still writing."


def _sha(pcm: np.ndarray) -> str:
    return hashlib.sha256(pcm.tobytes()).hexdigest()


def _stream(engine: Engine, text: str, params: SessionParams, step: int = 3):
    done, packets, ends = threading.Event(), [], []

    def sink(ev) -> None:
        (packets if isinstance(ev, AudioPacket) else ends).append(ev)
        if isinstance(ev, UtteranceEnd):
            done.set()

    s = engine.open_session(params, sink)
    data = text.encode()
    for i in range(0, len(data), step):
        s.push_text(data[i:i + step])
    s.flush()
    while not done.is_set():
        engine.run_once()
    s.close()
    return packets, ends[0]


def test_determinism_sampled():
    hashes = set()
    for _ in range(2):  # two engines built from the same preset seed
        engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=2))
        for _ in range(2):
            hashes.add(_sha(engine.synthesize(TEXT, "vivian", seed=42, max_frames=12)))
    assert len(hashes) == 1
    other = engine.synthesize(TEXT, "vivian", seed=43, max_frames=12)
    assert _sha(other) not in hashes


def test_streaming_equals_offline():
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=2))
    for sampling in (SamplingParams(), SamplingParams.greedy()):
        offline_pcm, offline_codes = engine.synthesize(TEXT, "vivian", seed=7, sampling=sampling,
                                                       max_frames=20, return_codes=True)
        packets, end = _stream(engine, TEXT, SessionParams(voice="vivian", seed=7,
                                                           sampling=sampling, max_frames=20))
        codes = np.concatenate([p.codes for p in packets])
        pcm = np.concatenate([p.pcm for p in packets])
        assert np.array_equal(codes, offline_codes)
        # Offline audio: one decode of the whole utterance.
        with torch.no_grad():
            whole = engine.model.speech_decoder(torch.from_numpy(codes).T[None])[0].numpy()
        assert np.abs(pcm - whole).max() <= 1e-4 and snr_db(whole, pcm) >= 60
        assert np.abs(offline_pcm - whole).max() <= 1e-4
        assert abs(len(pcm) - len(whole)) / engine.sample_rate <= 0.050  # duration gate
        assert end.frames == len(codes) == 20


def test_no_empty_audio(tiny_engine):
    for text in ["Hi.", "你好", "A much longer sentence, with commas, and more words."]:
        pcm = tiny_engine.synthesize(text, "serena", seed=1, max_frames=6)
        assert pcm.size == 6 * 1920 and np.isfinite(pcm).all() and np.sqrt(np.mean(pcm ** 2)) > 0


def test_max_length_guard_stops_runaway():
    # Random weights rarely sample EOS: without the guard this would not stop. The guard
    # follows the text's characters (length_guard.py): plain, East Asian wide, digits.
    settings = EngineSettings(max_sessions=2, max_frames_base=4, max_frames_per_char=1.0,
                              max_frames_per_wide_char=3.0, max_frames_per_digit=2.0)
    engine = Engine.from_preset("tiny", seed=0, settings=settings)
    _, end = _stream(engine, TEXT, SessionParams(voice="vivian", seed=1))
    assert end.reason == "max_frames" and end.frames == 4 + len(TEXT)
    _, end = _stream(engine, "你好，2026 ok", SessionParams(voice="vivian", seed=1))
    assert end.reason == "max_frames" and end.frames == 4 + 3 * 3 + 2 * 4 + 3  # ，is wide
    # The defaults: a 150-token reply (~600 characters) stops within ~100 s, not at 164 s.
    d = EngineSettings()
    length = TextLength()
    length.add("Hello there, how are you doing today? " * 16)  # 608 characters
    assert max_frames_for(length, d.max_frames_base, d.max_frames_per_char,
                          d.max_frames_per_wide_char, d.max_frames_per_digit) == 24 + 2 * 608
    # The hard cap and the KV-cache length bound it too.
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
        max_sessions=2, max_frames=7))
    assert _stream(engine, TEXT, SessionParams(voice="vivian", seed=1))[1].frames == 7
    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(
        max_sessions=2, max_seq_len=64))
    _, end = _stream(engine, TEXT, SessionParams(voice="vivian", seed=1))
    assert end.reason == "max_frames" and 0 < end.frames < 64
