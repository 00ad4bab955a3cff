"""Config presets and the official checkpoint layout (names mapped in one place)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from voice_tts.engine import Engine
from voice_tts.engine.checkpoint import load_model, random_model
from voice_tts.engine.config import PRESETS, ModelConfig
from voice_tts.engine.model import Qwen3TTS


def test_released_shapes():
    for name, hidden, mlp in (("0.6b", 1024, 3072), ("1.7b", 2048, 6144)):
        c = ModelConfig.from_name(name)
        t, cp, d = c.talker, c.code_predictor, c.speech_decoder
        assert (t.hidden_size, t.intermediate_size, t.num_hidden_layers) == (hidden, mlp, 28)
        assert (t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (16, 8, 128)
        assert (t.vocab_size, t.text_vocab_size, t.text_hidden_size) == (3072, 151936, 2048)
        assert t.mrope_section == (24, 20, 20) and t.rope_theta == 1e6
        assert (cp.hidden_size, cp.num_hidden_layers, cp.vocab_size) == (1024, 5, 2048)
        assert (d.codebook_dim, d.hidden_size, d.num_hidden_layers, d.sliding_window) == \
            (512, 512, 8, 72)
        assert d.frame_samples == 1920 and d.sample_rate == 24000
    with torch.device("meta"):  # the real sizes build (no memory) with the expected counts
        n06 = sum(p.numel() for p in Qwen3TTS(PRESETS["0.6b"]).talker.parameters())
        n17 = sum(p.numel() for p in Qwen3TTS(PRESETS["1.7b"]).talker.parameters())
    assert 0.7e9 < n06 < 1.0e9 and 1.6e9 < n17 < 2.1e9, (n06, n17)
    assert ModelConfig.from_name("tiny-1.7b").talker.hidden_size == \
        2 * ModelConfig.from_name("tiny-1.7b").code_predictor.hidden_size
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.from_name("2b")


def test_hf_config_round_trip():
    for name, cfg in PRESETS.items():
        main, speech = cfg.to_hf_dict()
        back = ModelConfig.from_hf_dict(json.loads(json.dumps(main)),
                                        json.loads(json.dumps(speech)), name=name)
        assert back == cfg, name


def test_load_written_checkpoint(checkpoints, engines):
    for name, path in checkpoints.items():
        model = load_model(path)
        ref = random_model(ModelConfig.from_name(name), 0).state_dict()
        got = model.state_dict()
        assert set(got) == set(ref)
        eos = model.cfg.talker.codec_eos_token_id
        for k, v in ref.items():
            if k == "talker.codec_head.weight":  # the test checkpoints boost the EOS row
                v = v.clone()
                v[eos] *= 2.0
            assert torch.equal(got[k], v), k
    assert (checkpoints["tiny-1.7b"] / "model.safetensors.index.json").exists()  # sharded
    assert engines["tiny-1.7b"].cfg.supports_instruct
    assert not engines["tiny"].cfg.supports_instruct


def test_loader_errors(checkpoints, tmp_path):
    with pytest.raises(FileNotFoundError, match="no hub access"):
        load_model("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    bad = tmp_path / "bad"
    shutil.copytree(checkpoints["tiny"], bad)
    weights = load_file(bad / "model.safetensors")
    weights["talker.extra.weight"] = torch.zeros(1)
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected"):
        load_model(bad)
    del weights["talker.extra.weight"], weights["talker.codec_head.weight"]
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(ValueError, match="lacks"):
        load_model(bad)


def test_bf16_load(checkpoints):
    engine = Engine.from_pretrained(checkpoints["tiny"], dtype=torch.bfloat16)
    pcm = engine.synthesize("Hello there.", "vivian", max_frames=3)
    assert pcm.dtype.name == "float32" and len(pcm) == 3 * 1920
