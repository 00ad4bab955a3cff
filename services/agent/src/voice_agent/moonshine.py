"""Moonshine tiny-en on our own ONNX Runtime sessions: the offline ear's default model.

The `moonshine-voice==0.1.0` wheel ships the model (an ORT-format encoder and merged
decoder, and its tokenizer) and a C++ library that runs it on a bundled ONNX Runtime
whose thread pools are sized by the host's cores, with no setting (46 threads a process
on a 16-core host, so 16 recognisers at once fight over the cores). Here the same files
run on the `onnxruntime` package with `threads` intra-op threads (`AGENT_STT_THREADS`),
one inter-op thread, no spinning, sequential execution.

The decode is the library's (`core/moonshine-model.cpp`, `bin-tokenizer.cpp` at v0.1.0):
the encoder over the 16 kHz samples, then greedy decoding with the decoder's KV cache
from token 1 until token 2 or ceil(seconds x 6.5) tokens; the cross-attention cache is
taken from the first step, the self-attention cache from every step. The text is the
tokens' bytes joined, specials (`<...>`) skipped, "▁" made a space, trimmed, invalid
UTF-8 made "?". The library's `transcribe_without_streaming` first cuts the audio into
voice segments with its own Silero VAD; the agent's VAD has already cut the utterance,
so the worker (sphinx.py) hears it whole, less its last partial `VAD_HOP` (the library's
VAD passes whole hops of 512 samples: on a short utterance its one segment is exactly
that). Same text as the library on onnxruntime 1.23.2 (its bundled build); a later
onnxruntime's int8 kernels round a little otherwise, so a near-tie between two words may
go the other way (tests/test_moonshine.py compares both).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .onnx import session_options

START_TOKEN = 1
EOS_TOKEN = 2
MAX_TOKENS_PER_S = 6.5
SAMPLE_RATE = 16000
SPACE = "▁".encode()
VAD_HOP = 512  # the library's VAD reads whole hops of this many samples
# tiny's decoder cache, [batch, heads, positions, head_dim], if its inputs don't say
KV_HEADS, HEAD_DIM = 8, 36


def model_dir() -> Path:
    """Moonshine tiny-en's files inside the moonshine-voice wheel, found without importing
    the package (its __init__ loads the 42 MB C library, which this path never runs)."""
    import importlib.util

    spec = importlib.util.find_spec("moonshine_voice")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("moonshine-voice==0.1.0 is not installed: it ships Moonshine "
                           "tiny-en's model files (services/agent/pyproject.toml)")
    return Path(spec.submodule_search_locations[0]) / "assets" / "tiny-en"


def read_tokenizer(path: Path) -> list[bytes]:
    """`tokenizer.bin`: per token, its byte count (one byte under 128, else two:
    `b1 - 128 + b2 * 128`; 0 = an empty entry), then its bytes."""
    data = path.read_bytes()
    tokens: list[bytes] = []
    i = 0
    while i < len(data):
        n = data[i]
        i += 1
        if n >= 128:
            n = data[i] * 128 + n - 128
            i += 1
        tokens.append(data[i:i + n])
        i += n
    return tokens


def _sanitize(b: bytes) -> bytes:
    """The library's `sanitize_text`: a byte that does not start a well-formed 2-4 byte
    sequence by its lead/continuation bits becomes "?"."""
    out = bytearray()
    i = 0
    while i < len(b):
        c = b[i]
        n = 1 if c < 0x80 else 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 \
            else 4 if c & 0xF8 == 0xF0 else 0
        if n and i + n <= len(b) and all(x & 0xC0 == 0x80 for x in b[i + 1:i + n]):
            out += b[i:i + n]
            i += n
        else:
            out += b"?"
            i += 1
    return bytes(out)


def detokenize(tokens: list[int], vocab: list[bytes]) -> str:
    """Token ids -> text, as the library and its Python binding write it."""
    parts = []
    for t in tokens:
        b = vocab[t] if 0 <= t < len(vocab) else b""
        if len(b) > 2 and b[:1] == b"<" and b[-1:] == b">":
            continue  # a special token (<s>, </s>, ...)
        parts.append(b)  # an empty or unknown entry: the library throws; nothing here
    text = b"".join(parts).replace(SPACE, b" ").strip(b" \t")
    return _sanitize(text).decode("utf-8", errors="ignore")


def max_tokens(samples: int) -> int:
    """The library's cap on decoded tokens, in its float32 arithmetic."""
    return math.ceil(np.float32(samples) / np.float32(SAMPLE_RATE)
                     * np.float32(MAX_TOKENS_PER_S))


class Moonshine:
    """Moonshine tiny-en: 16 kHz float samples in [-1, 1] -> text."""

    def __init__(self, threads: int = 1, path: Path | None = None) -> None:
        import onnxruntime as ort

        path = path or model_dir()
        opts = session_options(threads)
        # as the library loads them, but for its weights' prepacking (it turns it off):
        # packed once at load, a pass over a 2.0 s turn takes 58 ms, not 79, on one core
        # here, with the same words and probabilities, for 19 MB more a worker
        # (bench/README.md "The ear's pass")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.enable_cpu_mem_arena = False
        opts.log_severity_level = 3
        cpu = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(path / "encoder_model.ort"), opts, providers=cpu)
        self.decoder = ort.InferenceSession(str(path / "decoder_model_merged.ort"), opts,
                                            providers=cpu)
        self.vocab = read_tokenizer(path / "tokenizer.bin")
        self._enc_in = [i.name for i in self.encoder.get_inputs()]
        dec_in = {i.name: i for i in self.decoder.get_inputs()}
        self._dec_out = [o.name for o in self.decoder.get_outputs()]
        self._mask_to_decoder = len(self._enc_in) > 1 and "encoder_attention_mask" in dec_in
        # past_key_values.<layer>.<decoder|encoder>.<key|value> <- present.<same>
        self._past = {n: self._dec_out.index("present." + n.removeprefix("past_key_values."))
                      for n in dec_in if n.startswith("past_key_values.")}
        shape = dec_in[next(iter(self._past))].shape
        self._kv_shape = (1, shape[1] if isinstance(shape[1], int) else KV_HEADS, 1,
                          shape[3] if isinstance(shape[3], int) else HEAD_DIM)

    def tokens(self, audio: np.ndarray) -> list[int]:
        """The decoded token ids, from the start token to the end token or the cap."""
        return self._decode(audio)[0]

    def _decode(self, audio: np.ndarray) -> tuple[list[int], np.ndarray | None, np.ndarray]:
        """The decoded token ids (as `tokens`), the logits the last word piece was chosen
        from (None: no word), and the last step's: only those two are turned into
        probabilities (`hear`), not the whole vocabulary at every step."""
        x = np.ascontiguousarray(audio, np.float32).reshape(1, -1)
        feeds: dict[str, np.ndarray] = {self._enc_in[0]: x}
        mask = np.ones(x.shape, np.int64)
        if len(self._enc_in) > 1:
            feeds[self._enc_in[1]] = mask
        hidden = self.encoder.run(None, feeds)[0]
        # the first step takes no cache (use_cache_branch false): any values of this shape
        past = {n: np.zeros(self._kv_shape, np.float32) for n in self._past}
        tokens: list[int] = [START_TOKEN]
        word_logits: np.ndarray | None = None
        for step in range(max_tokens(x.shape[1])):
            feeds = {"input_ids": np.array([[tokens[-1]]], np.int64),
                     "encoder_hidden_states": hidden,
                     "use_cache_branch": np.array([step > 0]), **past}
            if self._mask_to_decoder:
                feeds["encoder_attention_mask"] = mask
            out = self.decoder.run(self._dec_out, feeds)
            for n, i in self._past.items():
                if step == 0 or ".decoder." in n:  # the encoder's cache is step 0's
                    past[n] = out[i]
            logits = out[0].reshape(-1)
            token = int(np.argmax(logits))
            tokens.append(token)
            if self._is_word(token):
                word_logits = logits
            if token == EOS_TOKEN:
                break
        return tokens, word_logits, logits

    def transcribe(self, audio: np.ndarray) -> str:
        if len(audio) == 0:
            return ""
        return detokenize(self.tokens(audio), self.vocab)

    def _is_word(self, token: int) -> bool:
        """A piece of a word: letters or digits, not a special token nor punctuation."""
        b = self.vocab[token] if 0 <= token < len(self.vocab) else b""
        if len(b) > 2 and b[:1] == b"<" and b[-1:] == b">":
            return False
        return any(chr(c).isalnum() for c in b if c < 128)

    def hear(self, audio: np.ndarray) -> tuple[str, float, float]:
        """The text, and how sure the decoder was of its end: the probability of the end
        token where it ended (0: the cap came first), and of the last word's last token
        (1 with no word). On synthetic speech an utterance cut before its last word
        ("how to get to | the pharmacy") is often written without that word ("how to
        get"), or with another in its place, at lower probabilities than complete
        sentences get (bench/README.md "The ear's own doubt")."""
        if len(audio) == 0:
            return "", 1.0, 1.0
        tokens, word_logits, end_logits = self._decode(audio)
        p_end = _chosen_p(end_logits) if tokens[-1] == EOS_TOKEN else 0.0
        p_last = _chosen_p(word_logits) if word_logits is not None else 1.0
        return detokenize(tokens, self.vocab), p_end, p_last


def _chosen_p(logits: np.ndarray) -> float:
    """The softmax probability of the greedy (largest) logit: 1 / sum(exp(l - max))."""
    x = logits.astype(np.float64)
    return float(1.0 / np.exp(x - x.max()).sum())
