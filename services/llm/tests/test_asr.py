"""The ASR step: audio parts reach a text-only model as their transcript.

The speech model is a tiny random wav2vec2-CTC built here (character vocab, 1 layer): its
transcript is gibberish, but it runs the real Transformers ASR pipeline, so the test shows
the wiring end to end: audio in, transcript in the prompt, a reply out.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
import torch
from conftest import Thinker, make_settings, request, text_of, user
from transformers import (
    Wav2Vec2Config,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    Wav2Vec2Processor,
    pipeline,
)
from voice.llm.v1 import thinker_pb2 as pb
from voice_llm.audio import encode_wav
from voice_llm.backends.base import render_prompt
from voice_llm.server import ThinkerServer

TONE = (np.sin(np.arange(8000) * 2 * np.pi * 440 / 16000) * 0.3).astype(np.float32)


@pytest.fixture(scope="module")
def asr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-wav2vec2")
    letters = "abcdefghijklmnopqrstuvwxyz'"
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate(letters)}}
    (out / "vocab.json").write_text(json.dumps(vocab))
    tok = Wav2Vec2CTCTokenizer(str(out / "vocab.json"), word_delimiter_token="|")
    fe = Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=16000,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=False,
    )
    Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok).save_pretrained(out)
    config = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(32, 32),
        conv_stride=(5, 4),
        conv_kernel=(10, 8),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
        initializer_range=0.5,
        do_stable_layer_norm=True,
        feat_extract_norm="layer",
    )
    torch.manual_seed(0)
    Wav2Vec2ForCTC(config).eval().save_pretrained(out)
    return out


@pytest_asyncio.fixture(scope="module")
async def hearing(cache_dir: Path, asr_dir: Path) -> AsyncIterator[Thinker]:
    server = ThinkerServer(make_settings(cache_dir, asr_model=str(asr_dir)))
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield Thinker(server, channel)
    await server.stop()


async def test_audio_is_transcribed_into_the_prompt(hearing: Thinker, asr_dir: Path) -> None:
    transcript = pipeline("automatic-speech-recognition", model=str(asr_dir), device="cpu")(
        {"raw": TONE, "sampling_rate": 16000}
    )["text"].strip()
    assert transcript, "the tiny speech model should say something"

    audio = pb.AudioPart(data=encode_wav(TONE), format=pb.AUDIO_FORMAT_WAV, sample_rate=16000)
    deltas = await hearing.chat(
        request(user(audio, " - what did I say?"), max_tokens=8, temperature=0.0)
    )
    tok = hearing.backend.tokenizer
    want = render_prompt(tok, [{"role": "user", "content": transcript + " - what did I say?"}])
    assert deltas[-1].final.prompt_tokens == len(tok(want).input_ids)
    assert deltas[-1].final.completion_tokens == 8
    same_as_text = await hearing.chat(
        request(user(transcript + " - what did I say?"), max_tokens=8, temperature=0.0)
    )
    assert text_of(deltas) == text_of(same_as_text)


async def test_bad_audio_is_still_rejected_with_asr(hearing: Thinker) -> None:
    audio = pb.AudioPart(data=encode_wav(TONE, 8000), format=pb.AUDIO_FORMAT_WAV)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await hearing.chat(request(user(audio)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "8000 Hz" in err.value.details()
