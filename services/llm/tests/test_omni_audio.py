"""The thinker hears: audio into a tiny Qwen2.5-Omni thinker through the Transformers backend.

A request's clip goes through our features, placeholders and batched prefill / decode; its
greedy reply must be what HF `generate` makes from the processor's inputs (the features
padded to 30 s with their mask, each `<|AUDIO|>` repeated to the clip's token count),
alone, and batched beside a text request and another clip (rows prefilled together at
different lengths). Cancelling an audio request stops its steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import torch
from conftest import make_settings
from transformers import (
    AutoTokenizer,
    Qwen2_5OmniThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)
from voice_llm.backends.omni import audio_tokens
from voice_llm.backends.transformers_backend import TransformersBackend
from voice_llm.chat import AudioClip, ChatJob, ChatMessage, Role, SamplingOptions
from voice_llm.tiny_omni import build_tiny_omni

N = 12


def clip(seconds: float, seed: int) -> AudioClip:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    return AudioClip(tone.astype(np.float32))


def job(rid: str, *parts: str | AudioClip, max_tokens: int = N) -> ChatJob:
    return ChatJob(rid, (ChatMessage(Role.USER, parts),),
                   SamplingOptions(max_tokens=max_tokens, temperature=0.0, top_p=1.0))


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_omni(tmp_path_factory.mktemp("omni") / "tiny-omni")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(omni_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = TransformersBackend(make_settings(omni_dir.parent, max_concurrent=4), omni_dir)
    await b.start()
    yield b
    await b.close()


def reference(omni_dir: Path, before: str, audio: AudioClip, after: str) -> str:
    """HF generate on the processor's inputs: our code only renders nothing here."""
    tok = AutoTokenizer.from_pretrained(omni_dir)
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        omni_dir, dtype=torch.float32).eval()
    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    f = fe(audio.samples, sampling_rate=16000, padding="max_length", return_attention_mask=True,
           return_tensors="pt")
    n = audio_tokens(int(f.attention_mask.sum()))
    content = before + "<|audio_bos|>" + "<|AUDIO|>" * n + "<|audio_eos|>" + after
    text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             input_features=f.input_features,
                             feature_attention_mask=f.attention_mask,
                             max_new_tokens=N, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


async def reply(backend: TransformersBackend, j: ChatJob) -> str:
    return "".join([c.text async for c in backend.generate(j)])


async def test_accepts_audio(backend: TransformersBackend) -> None:
    assert backend.accepts_audio


async def test_audio_reply_equals_hf_generate(backend: TransformersBackend,
                                              omni_dir: Path) -> None:
    a = clip(2.5, 1)
    want = await asyncio.to_thread(reference, omni_dir, "hi ", a, " ok")
    assert want  # the tiny model says something, and it hears: other audio, other words
    assert want != await asyncio.to_thread(reference, omni_dir, "hi ", clip(2.5, 4), " ok")
    assert await reply(backend, job("alone", "hi ", a, " ok")) == want


async def test_audio_batched_beside_text_and_audio(backend: TransformersBackend,
                                                   omni_dir: Path) -> None:
    a, b = clip(2.5, 1), clip(1.3, 2)
    want_a = await asyncio.to_thread(reference, omni_dir, "hi ", a, " ok")
    want_b = await asyncio.to_thread(reference, omni_dir, "", b, "")
    text_alone = await reply(backend, job("t0", "What time is it?"))
    got = await asyncio.gather(reply(backend, job("a", "hi ", a, " ok")),
                               reply(backend, job("t", "What time is it?")),
                               reply(backend, job("b", b)))
    assert got == [want_a, text_alone, want_b]


async def test_cancel_an_audio_request(backend: TransformersBackend) -> None:
    stream = backend.generate(job("c", clip(3.0, 3), max_tokens=1000))
    await anext(stream)
    await stream.aclose()
    deadline = time.monotonic() + 5
    while not backend.steps_run("c")[1]:
        assert time.monotonic() < deadline, "the cancelled request still runs"
        await asyncio.sleep(0.01)
    steps = backend.steps_run("c")[0]
    assert steps < 50
    await asyncio.sleep(0.2)
    assert backend.steps_run("c")[0] == steps
