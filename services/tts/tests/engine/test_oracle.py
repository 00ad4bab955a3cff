"""Our engine vs the official qwen-tts code on the same random-weight checkpoint files.

Greedy (talker and sub-talker), CPU, float32. For every case: codes identical frame by
frame (all 16 codebooks, same number of frames: EOS and the length cap stop at the same
frame), and audio (ours: decoded frame by frame as the engine streams, through the
incremental decoder; official: one-shot decode) within SNR >= 60 dB and max abs diff <= 1e-4.
Streaming cases push the text in small random pieces (str and UTF-8-splitting bytes)
through a session of the threaded engine: `non_streaming_mode=False` of the official
code. Offline cases use `non_streaming_mode=True`.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from voice_tts.engine import AudioPacket, SamplingParams, SessionParams, UtteranceEnd
from voice_tts.engine.api import packet_ramp

from .lib import CONFIGS, run_oracle, snr_db

# id, text, speaker, language, instruct, non_streaming_mode, max_new_tokens
CASES = [
    ("stream_en", "Hello there, streaming world.", "vivian", "english", "", False, 48),
    ("offline_en", "Hello there, streaming world.", "vivian", "english", "", True, 48),
    ("stream_zh_dialect", "你好，欢迎使用语音合成服务。", "dylan", "auto", "", False, 40),
    ("stream_instruct", "Real-time voice agents speak.", "serena", "auto",
     "Speak slowly and warmly.", False, 32),
    ("offline_cap", "The quick brown fox jumps over the lazy dog.", "ryan", "english", "",
     True, 20),
]
MIN_SNR_DB, MAX_ABS = 60.0, 1e-4
RESULTS: dict[str, dict] = {}


def _pieces(text: str, rng: random.Random) -> list[str | bytes]:
    data, out, i = text.encode(), [], 0
    while i < len(data):
        n = rng.randint(1, 5)
        out.append(data[i:i + n])
        i += n
    # Re-join some pieces as str where they fall on character boundaries.
    result = []
    for p in out:
        try:
            result.append(p.decode() if rng.random() < 0.5 else p)
        except UnicodeDecodeError:
            result.append(p)
    return result


class _Sink:
    """A session's packets, and events for its first packet and its end."""

    def __init__(self) -> None:
        self.packets: list[AudioPacket] = []
        self.first, self.done = threading.Event(), threading.Event()

    def __call__(self, ev) -> None:
        if isinstance(ev, AudioPacket):
            self.packets.append(ev)
            self.first.set()
        elif isinstance(ev, UtteranceEnd):
            self.done.set()


def _open(engine, case, sink: _Sink):
    """A greedy session of the threaded engine for a case (its cap: max_new_tokens - 1)."""
    _, _, speaker, language, instruct, _, max_new = case
    engine.start()
    return engine.open_session(SessionParams(voice=speaker, language=language,
                                             instruct=instruct,
                                             sampling=SamplingParams.greedy(),
                                             max_frames=max_new - 1), sink)


def _stream(engine, case, seed: int) -> tuple[np.ndarray, np.ndarray]:
    text = case[1]
    sink = _Sink()
    done, packets = sink.done, sink.packets
    s = _open(engine, case, sink)
    try:
        for piece in _pieces(text, random.Random(seed)):
            s.push_text(piece)
        s.flush()
        assert done.wait(120), "no UtteranceEnd"
    finally:
        s.close()
    sizes, sent = [p.frames for p in packets], 0
    for n in sizes[:-1]:  # the packet ramp: 1, 1, 1, 1, 2, 3, 4, 4 ...
        assert n == packet_ramp(sent, 1, 4), sizes
        sent += n
    assert 1 <= sizes[-1] <= packet_ramp(sent, 1, 4), sizes
    return np.concatenate([p.codes for p in packets]), np.concatenate([p.pcm for p in packets])


@pytest.fixture(scope="module")
def oracle(engines, checkpoints, tmp_path_factory) -> dict[str, np.ndarray]:
    runs = []
    for name in CONFIGS:
        tok = engines[name].tokenizer
        ids = {}
        for _, text, _, _, instruct, _, _ in CASES:
            ids[f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"] = \
                tok.assistant_ids(text)
            if instruct:
                ids[f"<|im_start|>user\n{instruct}<|im_end|>\n"] = tok.instruct_ids(instruct)
        runs.append({"checkpoint": str(checkpoints[name]), "ids": ids, "cases": [
            {"text": c[1], "speaker": c[2], "language": c[3], "instruct": c[4],
             "non_streaming_mode": c[5], "max_new_tokens": c[6]} for c in CASES]})
    return run_oracle({"runs": runs}, tmp_path_factory.mktemp("oracle"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_official(config, case, engines, oracle):
    engine = engines[config]
    r, i = CONFIGS.index(config), CASES.index(case)
    ref_codes, ref_audio = oracle[f"codes_{r}_{i}"], oracle[f"audio_{r}_{i}"]
    if case[5]:  # offline: non_streaming_mode=True, whole text known
        audio, codes = engine.synthesize(case[1], case[2], case[3], instruct=case[4],
                                         sampling=SamplingParams.greedy(),
                                         non_streaming_mode=True, max_frames=case[6] - 1,
                                         return_codes=True)
    else:
        codes, audio = _stream(engine, case, seed=i)
    mismatched = int((codes != ref_codes).any(axis=1).sum()) if codes.shape == ref_codes.shape \
        else -1
    assert codes.shape == ref_codes.shape, (codes.shape, ref_codes.shape)
    assert mismatched == 0, f"{mismatched} frames differ"
    assert audio.shape == ref_audio.shape
    snr, max_abs = snr_db(ref_audio, audio), float(np.abs(ref_audio - audio).max())
    RESULTS[f"{config}/{case[0]}"] = {"frames": len(codes), "snr_db": round(snr, 1),
                                     "max_abs": max_abs, "version": str(oracle["version"])}
    print(f"\n{config}/{case[0]}: frames={len(codes)} mismatched=0 snr={snr:.1f}dB "
          f"max_abs={max_abs:.2e} official=qwen-tts-hf {oracle['version']}")
    assert snr >= MIN_SNR_DB
    assert max_abs <= MAX_ABS


def test_stop_paths_covered(oracle):
    """The cases above end both by EOS (< cap) and by the cap (== max_new_tokens - 1)."""
    lengths = {(r, i): len(oracle[f"codes_{r}_{i}"]) for r in range(len(CONFIGS))
               for i in range(len(CASES))}
    caps = {(r, i): CASES[i][6] - 1 for (r, i) in lengths}
    assert any(n < caps[k] for k, n in lengths.items()), lengths
    assert any(n == caps[k] for k, n in lengths.items()), lengths


@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", CONFIGS)
def test_speech_from_the_first_word_matches_official(config, engines, oracle):
    """Text sent a word at a time, as an LLM writes it: the first audio comes before the
    second word is sent (the prompt needs only the first stable text id), and the codes
    still equal the official code's for the whole text, frame by frame."""
    engine, case = engines[config], CASES[0]
    ref = oracle[f"codes_{CONFIGS.index(config)}_0"]
    sink = _Sink()
    first, done, packets = sink.first, sink.done, sink.packets
    s = _open(engine, case, sink)
    words = [w + " " for w in case[1].split(" ")]  # "Hello ", "there, ", ...
    words[-1] = words[-1].rstrip()
    try:
        s.push_text(words[0])
        assert first.wait(60), "no audio from the first word alone"
        assert packets[0].first_frame == 0 and not done.is_set()
        for w in words[1:]:
            s.push_text(w)
        s.flush()
        assert done.wait(120), "no UtteranceEnd"
    finally:
        s.close()
    codes = np.concatenate([p.codes for p in packets])
    assert codes.shape == ref.shape and np.array_equal(codes, ref)
