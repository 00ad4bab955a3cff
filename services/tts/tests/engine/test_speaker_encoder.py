"""The Base model's speaker encoder vs the official code, and Base checkpoint loading.

Tiny Base checkpoints (`tiny-base`, x-vector 64 wide; `tiny-1.7b-base`, 128 wide) are
written by our `save_checkpoint`; the official `Qwen3TTSForConditionalGeneration` loads
the same files strictly in the oracle venv (oracle_speaker.py). Compared, float32, CPU:
- the reference at 24 kHz: ours (`to_24k`, soxr "HQ") == the official `librosa.resample`
  bit for bit, for 16 / 22.05 / 44.1 kHz inputs of odd lengths;
- the log-mel: ours == the official `mel_spectrogram` (our numpy Slaney filter bank);
- the x-vector: ours == the official `extract_speaker_embedding`.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import soxr
import torch
from safetensors.torch import load_file, save_file
from voice_tts.engine.audio_features import mel_spectrogram, slaney_mel_filters, to_24k
from voice_tts.engine.checkpoint import load_model, random_model, save_checkpoint
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.model.speaker_encoder import x_vector

from .lib import run_oracle

BASE_CONFIGS = ("tiny-base", "tiny-1.7b-base")
MEL_MAX_ABS = 1e-5  # log-mel; measured 0.0 (same torch build)
XVEC_MAX_REL = 1e-5  # max |ours - official| / max |official|


def _voice(sr: int, n: int, f0: float, seed: int) -> np.ndarray:
    """A voiced-like test signal: harmonics with vibrato, a slow envelope, some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 12))
    wav *= 0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t) ** 2
    wav += 0.02 * rng.standard_normal(n)
    return (0.3 * wav / np.abs(wav).max()).astype(np.float32)


# name: (sample rate, audio). Lengths where soxr's output is one sample shorter than
# librosa's ceil(N * ratio) (22.05 and 44.1 kHz): librosa zero-pads, so must `to_24k`.
INPUTS = {
    "s24k": (24000, _voice(24000, 52801, 140.0, 0)),
    "s16k": (16000, _voice(16000, 27201, 210.0, 1)),
    "s22k": (22050, _voice(22050, 24255, 180.0, 2)),
    "s44k": (44100, _voice(44100, 39694, 110.0, 3)),
    "short": (24000, _voice(24000, 2881, 160.0, 4)),
}


@pytest.fixture(scope="module")
def base_checkpoints(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("base")
    return {name: save_checkpoint(random_model(ModelConfig.from_name(name), seed=3), root / name)
            for name in BASE_CONFIGS}


@pytest.fixture(scope="module")
def oracle(base_checkpoints, tmp_path_factory) -> list[dict[str, np.ndarray]]:
    work = tmp_path_factory.mktemp("oracle_speaker")
    inputs = work / "inputs.npz"
    np.savez(inputs, **{f"wav_{k}": w for k, (_, w) in INPUTS.items()},
             **{f"sr_{k}": np.array(sr) for k, (sr, _) in INPUTS.items()})
    return [run_oracle({"checkpoint": str(path), "inputs": str(inputs)}, work,
                       script="oracle_speaker.py") for path in base_checkpoints.values()]


def test_resample_matches_librosa(oracle):
    for name, (sr, wav) in INPUTS.items():
        ours, official = to_24k(wav, sr), oracle[0][f"wav24k_{name}"]
        assert ours.dtype == official.dtype == np.float32
        assert np.array_equal(ours, official), name
        if name in ("s22k", "s44k"):  # plain soxr would be one sample short here
            assert len(soxr.resample(wav, sr, 24000, quality="HQ")) == len(official) - 1


def test_mel_matches_official(oracle):
    for name in INPUTS:
        wav = oracle[0][f"wav24k_{name}"]
        ours = mel_spectrogram(torch.from_numpy(wav)).numpy()
        official = oracle[0][f"mel_{name}"]
        assert ours.shape == official.shape == (1, (len(wav) - 256) // 256 + 1, 128)
        assert ours.dtype == np.float32
        diff = float(np.abs(ours - official).max())
        print(f"mel {name}: T={ours.shape[1]} max abs diff {diff:.3g}")
        assert diff <= MEL_MAX_ABS, name


def test_x_vector_matches_official(base_checkpoints, oracle):
    for (cfg_name, path), out in zip(base_checkpoints.items(), oracle, strict=True):
        model = load_model(path)
        for name, (sr, wav) in INPUTS.items():
            ours = x_vector(model, to_24k(wav, sr))
            official = out[f"xvec_{name}"]
            assert ours.shape == official.shape == (model.cfg.talker.hidden_size,)
            assert ours.dtype == np.float32
            rel = float(np.abs(ours - official).max() / np.abs(official).max())
            print(f"x-vector {cfg_name} {name}: max |official| {np.abs(official).max():.3g}, "
                  f"max rel diff {rel:.3g}")
            assert rel <= XVEC_MAX_REL, (cfg_name, name)


def test_slaney_filters_shape():
    f = slaney_mel_filters()
    assert f.shape == (128, 513) and f.dtype == np.float32
    assert (f >= 0).all() and (f.max(axis=1) > 0).all()  # no empty band up to 12 kHz


def test_base_checkpoint_round_trip(base_checkpoints):
    for name, path in base_checkpoints.items():
        cfg = ModelConfig.from_name(name)
        ref = random_model(cfg, seed=3)
        model = load_model(path)
        assert model.cfg.tts_model_type == "base" and model.cfg.talker.spk_id == {}
        assert model.cfg.speaker_encoder == cfg.speaker_encoder
        got = model.state_dict()
        assert set(got) == set(ref.state_dict())
        assert sum(k.startswith("speaker_encoder.") for k in got) == 76
        for k, v in ref.state_dict().items():
            assert torch.equal(got[k], v), k
        wav = INPUTS["s24k"][1]
        # Same weights; conv kernels may round differently on other memory (~1e-7).
        np.testing.assert_allclose(x_vector(model, wav), x_vector(ref, wav), rtol=0, atol=1e-5)


def test_base_without_speaker_encoder_fails(base_checkpoints, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(base_checkpoints["tiny-base"], bad)
    weights = load_file(bad / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("speaker_encoder.")},
              bad / "model.safetensors")
    with pytest.raises(ValueError, match=r"Base model .* lacks speaker encoder weights"):
        load_model(bad)


def test_voice_design_has_no_speaker_encoder(tmp_path):
    cfg = ModelConfig.from_name("tiny-1.7b-design")
    path = save_checkpoint(random_model(cfg, seed=1), tmp_path / "design")
    model = load_model(path)
    assert model.cfg.tts_model_type == "voice_design" and model.speaker_encoder is None
    assert model.cfg.talker.spk_id == {} and model.cfg.supports_instruct
    assert not any(k.startswith("speaker_encoder.") for k in load_file(path / "model.safetensors"))
    with pytest.raises(ValueError, match="no speaker encoder"):
        x_vector(model, INPUTS["s24k"][1])


def test_real_presets():
    for name, hidden, model_type in (("0.6b-base", 1024, "base"), ("1.7b-base", 2048, "base"),
                                     ("1.7b-design", 2048, "voice_design")):
        cfg = ModelConfig.from_name(name)
        assert cfg.tts_model_type == model_type and cfg.talker.hidden_size == hidden
        assert cfg.speaker_encoder.enc_dim == hidden and cfg.talker.spk_id == {}
        assert cfg.speaker_encoder.enc_channels == (512, 512, 512, 512, 1536)
    # An official Base config without spk_id lists no preset speakers either.
    main, speech = ModelConfig.from_name("0.6b-base").to_hf_dict()
    del main["talker_config"]["spk_id"], main["talker_config"]["spk_is_dialect"]
    assert ModelConfig.from_hf_dict(main, speech).talker.spk_id == {}


def test_too_short_reference(base_checkpoints):
    model = load_model(base_checkpoints["tiny-base"])
    for n in (100, 600):
        with pytest.raises(ValueError, match="too short"):
            x_vector(model, np.zeros(n, np.float32))
