"""Sampling: the official defaults and logits processors, batched, without host syncs.

Defaults are those of `Qwen3TTSModel._merge_generate_kwargs` / `generate`: talker
temperature 0.9, top_k 50, top_p 1.0, repetition_penalty 1.05; sub-talker (code
predictor) temperature 0.9, top_k 50, top_p 1.0; min_new_tokens 2; the top 1024 ids of the
codec vocabulary are suppressed except codec EOS. Processor order is Hugging Face's:
repetition penalty -> min-new-tokens (EOS masked) -> suppress tokens -> [sampling only:]
temperature -> top-k -> top-p. Greedy takes the argmax after the first three, as HF does.

Sampling draws a categorical sample as argmax(p / E) with E ~ Exp(1) (the exponential
race, exactly the categorical distribution). The noise E is a counter-based hash of
(the utterance's seed, the frame number, the stream, the vocabulary index) computed on
the device (`exp_noise`): a session's output depends on its seed alone, not on who else
is in the batch or on the order of steps, and the step has no host sync, no generator
state and no branch on tensor values (greedy rows take the argmax via `torch.where`), so
it can be captured in a CUDA graph.

The race's edge: the noise takes 23 random bits, so u = (k + 0.5) / 2**23 is exact in
float32 and at most 1 - 2**-24, and -log(u) > 0. With 24 bits the top value rounded to
u = 1.0, noise 0, and 0 / 0 = NaN at every id the filters removed, which argmax can pick
(1 talker draw in ~4,000 picked a removed id, one in ~12,000 an id past the codebooks).
The argmax also only looks at ids whose probability is above 0, so no noise can ever
pick a removed id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(do_sample=False, subtalker_do_sample=False)

    def validate(self) -> None:
        for name in ("temperature", "subtalker_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sampling.{name} must be > 0, got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"sampling.{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("top_k", "subtalker_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"sampling.{name} must be >= 0 (0 = off), got "
                                 f"{getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError("sampling.repetition_penalty must be > 0")


MIN_NEW_TOKENS = 2
TALKER_STREAM = 15  # noise streams 0..14: the code predictor's heads; 15: the talker
_M32 = 0xFFFFFFFF
NOISE_SHIFT = 9  # keep 23 of the hash's 32 bits: (k + 0.5) / 2**23 stays below 1.0


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) on int64 values < 2**32; the
    multiplier is < 2**31 so no product overflows int64."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def exp_noise(seed: torch.Tensor, counter: torch.Tensor, streams: torch.Tensor,
              vocab: int) -> torch.Tensor:
    """Exp(1) noise (B, S, vocab) for rows with `seed` (B,) and `counter` (B,) (the frame
    number), in noise streams `streams` (S,). Same inputs, same noise, on any device."""
    return exp_from_bits(noise_bits(seed, counter, streams, vocab))


def exp_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """32 hashed bits (int64 < 2**32) -> Exp(1) noise, float32, never 0."""
    u = ((bits >> NOISE_SHIFT).to(torch.float32) + 0.5) * (1.0 / (1 << (32 - NOISE_SHIFT)))
    return -torch.log(u)  # u in (0, 1 - 2**-24]


def noise_bits(seed: torch.Tensor, counter: torch.Tensor, streams: torch.Tensor,
               vocab: int) -> torch.Tensor:
    """The race's 32 hashed bits (B, S, vocab) behind `exp_noise`, int64 values < 2**32."""
    key = _mix(_mix(seed & _M32)[:, None] ^ ((counter[:, None] * 16 + streams) & _M32))
    idx = torch.arange(vocab, device=seed.device)
    return _mix(_mix(key[..., None] ^ idx) + 0x9E3779B9 & _M32)


def suppress_mask(vocab_size: int, eos_id: int, device=None) -> torch.Tensor:
    """(vocab,) bool: the official suppress_tokens (top 1024 ids except codec EOS)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[vocab_size - 1024:] = True
    mask[eos_id] = False
    return mask


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of one step, (B,) each; built by the runner."""

    do_sample: torch.Tensor  # bool
    temperature: torch.Tensor  # float
    top_k: torch.Tensor  # long, vocab size where off
    top_p: torch.Tensor  # float


def warp_and_sample(scores: torch.Tensor, p: SamplingTensors,
                    noise: torch.Tensor) -> torch.Tensor:
    """scores (B, V) after penalties/masks -> tokens (B,). noise (B, V) ~ Exp(1)."""
    return torch.where(p.do_sample, race(warp(scores, p).softmax(-1), noise),
                       scores.argmax(-1))


def race(prob: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(prob / noise) over the ids with prob > 0: (B, V) -> (B,). A removed id
    (prob 0) is never picked, whatever the noise (0 / 0 is NaN, and argmax takes NaN)."""
    return torch.where(prob > 0, prob / noise, -1.0).argmax(-1)


def warp(scores: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
    """HF's sampling warpers: temperature -> top-k -> top-p; (B, V) -> (B, V) scores."""
    s = scores / p.temperature[:, None]
    # top-k: keep scores >= the k-th largest (HF keeps ties).
    sorted_desc = s.sort(dim=-1, descending=True).values
    kth = sorted_desc.gather(-1, (p.top_k[:, None] - 1).clamp(min=0))
    s = s.masked_fill(s < kth, float("-inf"))
    # top-p: drop the low tail whose cumulative probability is <= 1 - top_p (keep >= 1).
    sorted_asc, idx = s.sort(dim=-1, descending=False)
    cum = sorted_asc.softmax(-1).cumsum(-1)
    remove = cum <= (1 - p.top_p[:, None])
    remove = torch.cat((remove[:, :-1], torch.zeros_like(remove[:, -1:])), dim=-1)
    return s.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))


def talker_scores(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor,
                  n_generated: torch.Tensor, suppress: torch.Tensor,
                  eos_id: int) -> torch.Tensor:
    """HF processors for codebook 0: logits (B, V) float32, seen (B, V) bool (tokens of
    this utterance so far), penalty (B,), n_generated (B,) long, suppress (V,) bool."""
    pen = penalty[:, None]
    penalized = torch.where(logits < 0, logits * pen, logits / pen)
    scores = torch.where(seen, penalized, logits)
    early = (n_generated < MIN_NEW_TOKENS)[:, None]
    # Built on the device (no host scalar copy: this runs inside a CUDA-graph capture).
    eos = torch.arange(suppress.shape[0], device=suppress.device) == eos_id
    scores = scores.masked_fill(early & eos[None], float("-inf"))
    return scores.masked_fill(suppress[None], float("-inf"))
