"""A small Qwen2-style byte-level BPE for random-weight presets and tests.

Real checkpoints bring the 151k-token Qwen2 vocabulary; presets have no tokenizer files,
so we train a ~500-token BPE on a fixed corpus with the same pipeline (NFC, the Qwen2
pre-tokenizer regex, byte-level BPE). Training is deterministic and takes milliseconds.
Every byte is in the alphabet, so any text encodes; "assistant" and "user" are single
tokens, as the prompt layout requires.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from .text import QWEN2_PATTERN, build_qwen2_tokenizer

CORPUS = [
    "assistant\n", "user\n", "system\n",
    "Hello there, streaming world. How are you today? I'm fine, thanks!",
    "The quick brown fox jumps over the lazy dog; it's 3:45 pm on 2026-01-29.",
    "Real-time voice agents speak while the language model is still writing.",
    "你好，欢迎使用语音合成服务。今天天气很好，我们一起去公园散步吧。",
    "Bonjour à tous, ça va? Über straße naïve café — «quotes» and émojis 🙂🎉.",
    "Numbers 0 1 2 3 4 5 6 7 8 9, and symbols: @#$%^&*()[]{}<>/\\|~`+=_-.",
]


def train(vocab_size: int = 512) -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20 + ["assistant user"] * 200, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


@functools.cache
def _trained() -> tuple[dict[str, int], list[tuple[str, str]]]:
    return train()


def demo_tokenizer() -> Tokenizer:
    vocab, merges = _trained()
    return build_qwen2_tokenizer(dict(vocab), list(merges))


def write_demo_tokenizer(directory: str | Path) -> Path:
    """vocab.json + merges.txt + tokenizer_config.json, as a checkpoint carries them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = _trained()
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False),
                                          encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768}),
        encoding="utf-8")
    return directory
