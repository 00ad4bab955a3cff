"""Reference codes: our Mimi encoder vs the official 12 Hz speech tokenizer's `encode`.

A tiny Base checkpoint is written by our `save_checkpoint` (random weights, random
non-degenerate codebooks) and loaded by the official `Qwen3TTSTokenizer.from_pretrained` in
the oracle venv (our preprocessor_config.json, `restore_mimi_full_attention`, then a strict
weight load). CPU, float32. Checks: codes (T, 16) identical to the wrapper's `encode` and to
the model's `encode`, T = ceil(N / 1920); pre-quantization latents within 1e-5.

Attention window: the official loader widens Mimi's 250-frame sliding window to full causal
attention (transformers 4.57.3 behaviour, says the fork); a third-party port keeps the window.
The two differ only past 10 s (250 frames at 25 Hz): the 12 s case pins us to the official.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import soxr
import torch
from safetensors.torch import load_file, save_file
from voice_tts.engine.checkpoint import load_model, random_model, save_checkpoint
from voice_tts.engine.config import ModelConfig, SpeechEncoderConfig
from voice_tts.engine.model.speech_encoder import reference_codes

from .lib import run_oracle

SR = 24000
FRAME = 1920
MAX_LATENT_DIFF = 1e-5


def _voice(seconds: float, rng: np.random.Generator, sr: int = SR) -> np.ndarray:
    """Speech-like test audio: a gliding harmonic tone, syllable-rate envelope, some noise."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    tone = sum(np.sin(k * phase) / k for k in range(1, 6))
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    return (0.25 * env * tone + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def _cases() -> dict[str, tuple[np.ndarray, int]]:
    rng = np.random.default_rng(38)
    gap = np.zeros(int(1.5 * SR), np.float32)
    return {
        "speech_3s": (_voice(3.1, rng)[: 3 * SR + 777], SR),  # not a multiple of 1920
        "exact_frames": (_voice(1.0, rng, SR)[: 12 * FRAME], SR),
        "short": (_voice(0.05, rng)[:1000], SR),  # under one frame
        "silence_inside": (np.concatenate([_voice(0.4, rng), gap, _voice(0.4, rng)]), SR),
        "silence_only": (np.zeros(int(1.2 * SR), np.float32), SR),
        "long_12s": (_voice(12.3, rng), SR),  # past the 250-frame window
        "sr16k": (_voice(2.5, rng, 16000), 16000),  # the official resamples with librosa
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech_encoder")
    model = random_model(ModelConfig.from_name("tiny-base"), seed=3)
    path = save_checkpoint(model, root / "tiny-base")
    return root, path, load_model(path)


@pytest.fixture(scope="module")
def oracle(base):
    root, path, _ = base
    cases = []
    for name, (wav, sr) in _cases().items():
        np.save(root / f"{name}.npy", wav)
        cases.append({"name": name, "wav": str(root / f"{name}.npy"), "sr": sr})
    return run_oracle({"checkpoint": str(path), "cases": cases}, root,
                      script="oracle_speech_encoder.py")


@pytest.mark.parametrize("name", list(_cases()))
def test_codes_match_official(base, oracle, name):
    _, _, model = base
    wav, sr = _cases()[name]
    wav24 = wav if sr == SR else soxr.resample(wav, sr, SR, quality="HQ").astype(np.float32)
    ours = reference_codes(model, wav24)
    assert ours.dtype == np.int64 and ours.shape == (math.ceil(len(wav24) / FRAME), 16)
    np.testing.assert_array_equal(ours, oracle[f"codes_{name}"])
    if sr != SR:
        return
    np.testing.assert_array_equal(ours, oracle[f"model_codes_{name}"])
    with torch.no_grad():
        latents = model.speech_encoder.latents(torch.from_numpy(wav24)[None])[0].numpy()
    ref = oracle[f"latents_{name}"]
    assert latents.shape == ref.shape
    assert np.abs(latents - ref).max() <= MAX_LATENT_DIFF * max(1.0, np.abs(ref).max())


def test_official_loader_uses_full_attention(oracle):
    assert int(oracle["sliding_window"]) == SpeechEncoderConfig().max_position_embeddings
    assert int(oracle["feature_sr"]) == SR


def test_codes_are_not_degenerate(base):
    _, _, model = base
    codes = reference_codes(model, _cases()["speech_3s"][0])
    assert all(len(np.unique(codes[:, q])) > codes.shape[0] // 2 for q in range(16))
    for n, frames in ((1, 1), (FRAME - 1, 1), (FRAME, 1), (FRAME + 1, 2)):
        assert reference_codes(model, np.full(n, 0.1, np.float32)).shape == (frames, 16)
    with pytest.raises(ValueError, match="non-empty"):
        reference_codes(model, np.zeros(0, np.float32))


def test_checkpoint_round_trip(base):
    _, path, model = base
    assert (path / "speech_tokenizer" / "preprocessor_config.json").exists()
    pre = json.loads((path / "speech_tokenizer" / "preprocessor_config.json").read_text())
    assert pre["feature_extractor_type"] == "EncodecFeatureExtractor"
    assert (pre["feature_size"], pre["sampling_rate"], pre["padding_value"]) == (1, SR, 0.0)
    written = load_file(path / "speech_tokenizer" / "model.safetensors")
    ours = {k: v for k, v in model.state_dict().items() if k.startswith("speech_encoder.")}
    assert {f"encoder.{k[len('speech_encoder.'):]}" for k in ours} == {
        k for k in written if k.startswith("encoder.")}
    book = model.speech_encoder.quantizer.acoustic_residual_vector_quantizer.layers[5].codebook
    assert book.initialized.item() == 1.0 and book.cluster_usage.min() > 0
    assert book.embed_sum.abs().sum() > 0
    assert model.speech_encoder.encoder_transformer.inv_freq.device.type == "cpu"


def test_other_types_skip_the_encoder(base, tmp_path):
    """CustomVoice / VoiceDesign checkpoints carry `encoder.*` too: loaded without it."""
    _, path, _ = base
    cv = tmp_path / "as_custom_voice"
    shutil.copytree(path, cv)
    cfg = json.loads((cv / "config.json").read_text())
    cfg["tts_model_type"] = "custom_voice"
    (cv / "config.json").write_text(json.dumps(cfg))
    model = load_model(cv)
    assert model.speech_encoder is None
    with pytest.raises(ValueError, match="Base"):
        reference_codes(model, np.zeros(FRAME, np.float32))
    # A Base checkpoint without the encoder's weights is refused.
    bare = tmp_path / "base_without_encoder"
    shutil.copytree(path, bare)
    st = bare / "speech_tokenizer" / "model.safetensors"
    save_file({k: v for k, v in load_file(st).items() if not k.startswith("encoder.")}, st)
    with pytest.raises(ValueError, match="lacks"):
        load_model(bare)


def test_encoder_config_from_transformers5_file():
    """transformers 5 writes `rope_parameters` and may omit `head_dim`; the top-level
    `encoder_valid_num_quantizers` is the number of codebooks kept."""
    enc = SpeechEncoderConfig.from_hf({
        "encoder_valid_num_quantizers": 8,
        "encoder_config": {"hidden_size": 256, "num_attention_heads": 4, "_frame_rate": 12.5,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
                           "upsampling_ratios": [8, 6, 5, 4]}})
    assert (enc.head_dim, enc.rope_theta, enc.valid_num_quantizers) == (64, 5000.0, 8)
    assert enc.frame_samples == FRAME
    default = SpeechEncoderConfig.from_hf({})
    assert default == SpeechEncoderConfig()
    assert (default.num_quantizers, default.codebook_size, default.codebook_dim) == (32, 2048, 256)
