"""Moonshine tiny-en on our own ONNX Runtime sessions (moonshine.py) against the wheel's
C++ library (`moonshine-voice==0.1.0`, whose model files both run), and the recogniser
worker's threads."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from voice_agent.moonshine import Moonshine, detokenize, max_tokens, model_dir
from voice_agent.sphinx import SphinxPool, _moonshine, _trim_silence

from .backends import espeak

# Same text from both on these (espeak-ng en-us). The decode is the library's step for
# step: on onnxruntime 1.23.2 (the build inside the wheel) all 18 utterances tried (6
# sentences x 3 voices, en-us, en-gb, en-us+f3) come out the same; on onnxruntime 1.32
# the int8 kernels round a little otherwise and 3 of those 18, near-ties between two
# words (logits "work" 16.82 vs "book" 16.59), come out otherwise. These are no near-ties.
SENTENCES = ["Tell me something nice.", "What is the weather like in Paris today?",
             "The quick brown fox jumps over the lazy dog.", "Yes."]


def test_detokenizing_and_the_length_cap_are_the_libraries() -> None:
    vocab = [b"<unk>", b"<s>", b"</s>", "▁Hel".encode(), b"lo", b"\xff", "▁é".encode()]
    assert detokenize([1, 3, 4, 6, 2], vocab) == "Hello é"
    assert detokenize([1, 5, 2], vocab) == "?"  # invalid UTF-8: "?", as the library
    assert detokenize([1, 2], vocab) == ""
    assert [max_tokens(n) for n in (0, 1, 16000, 32000, 24000)] == [0, 1, 7, 13, 10]


def test_our_session_hears_what_the_wheels_library_hears(tmp_path: Path) -> None:
    """The worker's transcribe (trimmed utterance, our session) against the old path
    (the same audio through `Transcriber.transcribe_without_streaming`), and our decode of
    each voice segment the library cut against the library's text for it."""
    from moonshine_voice.moonshine_api import ModelArch
    from moonshine_voice.transcriber import Transcriber

    library = Transcriber(str(model_dir()), ModelArch.TINY)
    ours = _moonshine(threads=1)
    model = Moonshine(threads=1)
    for text in SENTENCES:
        pcm = espeak(text, tmp_path, voice="en-us")
        audio = _trim_silence(pcm).astype(np.float32) / 32768.0
        lines = library.transcribe_without_streaming(audio.tolist(), 16000).lines
        heard = " ".join(line.text.strip() for line in lines).strip()
        assert heard, text
        assert ours(pcm.tobytes()).text == heard, text
        for line in lines:
            assert model.transcribe(np.array(line.audio_data, np.float32)) == line.text


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def test_the_worker_holds_the_threads_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENT_STT_THREADS=1: the main thread and onnxruntime's one, whatever the host's
    cores (the library took one per core and more: 46 on 16 cores, 4 on 2)."""
    monkeypatch.setenv("AGENT_STT_THREADS", "1")
    speech = espeak("Tell me something nice.", tmp_path).tobytes()
    counts = {}
    for threads in (None, 3):
        pool = SphinxPool(max_workers=1, model="moonshine", threads=threads)
        try:
            async with pool.utterance() as utt:
                utt.feed(speech)
                assert "something" in (await utt.finish()).text.lower()
            (w,) = pool._idle
            counts[pool.threads] = _threads(w.proc.pid)
        finally:
            await pool.aclose()
    assert counts[1] <= 3, counts
    assert counts[3] > counts[1], counts  # the setting reaches onnxruntime's pools
