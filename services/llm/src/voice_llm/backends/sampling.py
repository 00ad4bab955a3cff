"""Next-token choice for a batch of rows, each with its own options and generator.

Temperature + top-p sampling from each request's own torch.Generator, so a request's
`seed` gives the same reply whoever else shares the step; temperature 0 is greedy.
`allowed` (a bool tensor over the LM head (V,), or one a row (R, V), or None) bans every
id it does not mark.

A row whose logits are not finite gets no token but an error: torch.multinomial would
trip a device-side assert on it, which poisons the whole CUDA context (seen on the H100:
bf16 GEMMs returned NaN under an MPS SM cap, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` < 100).
Sampling is the exponential race instead (argmax of p / Exp(1) draws: a draw from p, no
assert, no sync).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from voice_llm.chat import SamplingOptions


def new_generator(options: SamplingOptions, device: torch.device) -> torch.Generator | None:
    if options.temperature <= 0:
        return None
    gen = torch.Generator(device=device)
    if options.seed is not None:
        gen.manual_seed(options.seed % 2**63)
    else:
        gen.seed()
    return gen


class NonFiniteLogits(RuntimeError):
    """The model's logits hold NaN or inf: its numerics are broken, not the request."""


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(p / Exp(1) noise) over the ids with p > 0 (..., V) -> (...). A dropped id
    (p 0) can never win: a noise of exactly 0 would make it 0 / 0 = NaN, and argmax takes
    NaN (the TTS sampler's 24-bit noise did reach 0)."""
    return torch.where(probs > 0, probs / noise, -1.0).argmax(dim=-1)


def pick(logits: torch.Tensor, options: Sequence[SamplingOptions],
         generators: Sequence[torch.Generator | None],
         allowed: torch.Tensor | None) -> list[int | NonFiniteLogits]:
    """logits (R, V) of R rows -> one token id per row (an error for a broken row)."""
    scores = logits.float()
    finite = torch.isfinite(scores).all(dim=-1)
    scores = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    picked = scores.argmax(dim=-1)
    sampled = [i for i, o in enumerate(options) if o.temperature > 0]
    if sampled:
        rows = torch.tensor(sampled, device=scores.device)
        temps = torch.tensor([options[i].temperature for i in sampled], device=scores.device)
        top_p = torch.tensor([options[i].top_p for i in sampled], device=scores.device)
        probs = torch.softmax(scores[rows] / temps[:, None], dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        drop = sorted_p.cumsum(dim=-1) - sorted_p > top_p[:, None]
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        for j, i in enumerate(sampled):
            noise = torch.empty_like(probs[j]).exponential_(1.0, generator=generators[i])
            picked[i] = race(probs[j], noise)
    bad = NonFiniteLogits("the model's logits are not finite (NaN / inf); under CUDA MPS "
                          "keep CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at 100 (deploy/README)")
    return [t if ok else bad for t, ok in zip(picked.tolist(), finite.tolist(), strict=True)]
