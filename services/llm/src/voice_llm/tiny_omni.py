"""Omni thinkers with random weights: Qwen2.5-Omni's thinker (audio encoder + Qwen2.5
decoder) at its released shapes for GPU benchmarks (`LLM_MODEL=random:qwen2.5-omni-7b`),
and at a tiny shape for CPU tests (`build_tiny_omni`).

The tokenizer is tiny_random's BPE plus Qwen2.5-Omni's audio tokens (`<|AUDIO|>` and its
bos / eos); the config's token ids point at them, so the prompt's placeholders, the chat
template and the model agree as in the release. The vision tower is cut to one small
block: nothing here sends images, and its 0.7 B parameters would only cost start-up time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voice_llm.tiny_random import RANDOM_MARKER, SPECIALS, train_tokenizer

AUDIO_SPECIALS = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]

# Qwen2.5-Omni-7B's and -3B's thinker config.json (text: Qwen2.5-7B / -3B; audio: the
# Whisper-large-v3-like encoder, 32 layers of 1280, projected to the text width).
_AUDIO = dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20,
              encoder_ffn_dim=5120, d_model=1280, max_source_positions=1500, n_window=100)
OMNI_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-omni-7b": dict(
        text=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                  num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                  tie_word_embeddings=False),
        audio=dict(_AUDIO, output_dim=3584)),
    "qwen2.5-omni-3b": dict(
        text=dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                  num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                  tie_word_embeddings=True),
        audio=dict(_AUDIO, output_dim=2048)),
}


def omni_thinker_config(tok: Any, text: dict[str, Any], audio: dict[str, Any],
                        mrope_section: list[int], dtype: str) -> Any:
    """A Qwen2.5-Omni thinker config over `tok` (which holds AUDIO_SPECIALS)."""
    from transformers import Qwen2_5OmniThinkerConfig

    audio_id, bos, eos = tok.convert_tokens_to_ids(AUDIO_SPECIALS)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return Qwen2_5OmniThinkerConfig(
        text_config=dict(
            text, max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=eot,
            eos_token_id=im_end, pad_token_id=eot,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0,
                                 mrope_section=mrope_section)),
        audio_config=audio,
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=1,
                           out_hidden_size=text["hidden_size"]),
        audio_token_index=audio_id, audio_start_token_id=bos, audio_end_token_id=eos,
        # get_rope_index reads it (the release's id); no prompt here holds it.
        vision_start_token_id=151652, torch_dtype=dtype)


def _generation_config(tok: Any) -> Any:
    from transformers import GenerationConfig

    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=eot,
                            do_sample=False)


def build_omni_shape(out: Path, shape: str) -> None:
    """A `random:` model dir at a released shape: no weights (made at load)."""
    tok = train_tokenizer(SPECIALS + AUDIO_SPECIALS)
    tok.save_pretrained(out)
    s = OMNI_SHAPES[shape]
    # head_dim 128: the three M-RoPE sections cover its 64 frequencies (the release's).
    omni_thinker_config(tok, s["text"], s["audio"], [16, 24, 24], "bfloat16").save_pretrained(out)
    _generation_config(tok).save_pretrained(out)
    (out / RANDOM_MARKER).write_text(f"{shape}: weights are made at load, random\n")


def build_tiny_omni(out: Path) -> Path:
    """A loadable tiny Qwen2.5-Omni thinker (float32 weights saved, seed 0) for CPU tests."""
    import torch
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    tok = train_tokenizer(SPECIALS + AUDIO_SPECIALS)
    tok.save_pretrained(out)
    config = omni_thinker_config(
        tok,
        # head_dim 64; 0.1 init: tiny weights at 0.02 repeat one token forever.
        text=dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  tie_word_embeddings=True, initializer_range=0.1),
        audio=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2,
                   encoder_ffn_dim=64, d_model=32, max_source_positions=1500, n_window=100,
                   output_dim=128, initializer_range=0.1),
        mrope_section=[8, 12, 12], dtype="float32")
    config.initializer_range = 0.1
    torch.manual_seed(0)
    Qwen2_5OmniThinkerForConditionalGeneration(config).eval().save_pretrained(out)
    _generation_config(tok).save_pretrained(out)
    return out
