"""One-launch sampling (Triton): `sampling.py`'s processors, warpers and seeded race.

Per row, in one pass over the vocabulary held in registers: [talker: repetition penalty,
min-new-tokens EOS mask, suppressed ids] -> greedy argmax | temperature -> top-k -> top-p
-> softmax / Exp(1) noise -> argmax. The reference sorts the vocabulary twice; here top-k
and top-p are thresholds found by a bisection over the float keys (32 counting passes
each, only when the row asks for them), and the noise is the same counter hash as
`sampling.exp_noise`, computed in place. Rows read their parameters, seed and frame
counter by slot from the runner's slot state, so a step needs no gathers.

Same tokens as the reference except where values tie at a top-k/top-p boundary (the
reference drops an arbitrary part of the tie; this keeps it whole) or float sums round
differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..sampling import MIN_NEW_TOKENS, NOISE_SHIFT, SamplingTensors
from .launch import pdl_args
from .layer_ops import _after_previous

_M32 = tl.constexpr(0xFFFFFFFF)
_SHIFT = tl.constexpr(NOISE_SHIFT)
_SCALE = tl.constexpr(1.0 / (1 << (32 - NOISE_SHIFT)))
# Warps per row by padded vocabulary size (bench/tune_sample.py measures them): the
# bisections are ~66 reductions over the row, each a cross-warp sync with more warps.
WARPS: dict[int, int] = {}


@triton.jit
def _mix(x):
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


@triton.jit
def _exp_noise(seed, counter, stream, idx):
    key = _mix(_mix(seed & _M32) ^ ((counter * 16 + stream) & _M32))
    bits = _mix((_mix(key ^ idx) + 0x9E3779B9) & _M32)
    u = ((bits >> _SHIFT).to(tl.float32) + 0.5) * _SCALE  # (0, 1 - 2**-24]: see sampling.py
    return -tl.log(u)


@triton.jit
def _ordered(s):
    """float32 -> int64 keys with the same order (-inf lowest)."""
    bits = s.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _warp_and_race(x, valid, idx, temp_ptr, topk_ptr, topp_ptr, seed_ptr, noise_ptr, row,
                   slot, counter, stream, V: tl.constexpr, GIVEN_NOISE: tl.constexpr):
    """temperature -> top-k -> top-p -> argmax(softmax / Exp(1) noise)."""
    s = x / tl.load(temp_ptr + slot)
    key = _ordered(s)
    k = tl.load(topk_ptr + slot)
    if k < V:  # keep s >= the k-th largest: the largest key with >= k keys at or above it
        lo = tl.full((), -(1 << 31), tl.int64)
        hi = tl.full((), 1 << 31, tl.int64)
        for _ in range(33):
            mid = lo + (hi - lo) // 2
            enough = tl.sum(((key >= mid) & valid).to(tl.int32), 0) >= k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        s = tl.where(key >= lo, s, float("-inf"))
        key = _ordered(s)
    top_p = tl.load(topp_ptr + slot)
    if top_p < 1.0:  # drop the low tail whose probability mass is <= 1 - top_p
        e = tl.exp(s - tl.max(s, 0))
        p = e / tl.sum(e, 0)
        tail = 1.0 - top_p
        lo = tl.full((), -(1 << 31) - 1, tl.int64)  # mass at or below: 0, never > tail
        hi = tl.max(key, 0)  # the best key is always kept
        for _ in range(33):
            mid = lo + (hi - lo) // 2
            over = tl.sum(tl.where(key <= mid, p, 0.0), 0) > tail
            hi = tl.where(over, mid, hi)
            lo = tl.where(over, lo, mid)
        s = tl.where(key >= hi, s, float("-inf"))
    e = tl.exp(s - tl.max(s, 0))
    prob = e / tl.sum(e, 0)
    if GIVEN_NOISE:
        noise = tl.load(noise_ptr + row.to(tl.int64) * V + idx, mask=valid, other=1.0)
    else:
        noise = _exp_noise(tl.load(seed_ptr + slot), counter, stream, idx)
    # Only ids with prob > 0: a removed id's 0 / 0 is NaN, which argmax may take.
    return tl.argmax(tl.where(valid & (prob > 0), prob / noise, -1.0), 0)


@triton.jit
def _sample(logits_ptr, s_l, slots_ptr, do_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr,
            count_ptr, count_offset, stream, seen_ptr, s_seen, pen_ptr, sup_ptr, eos_id,
            noise_ptr, out_ptr, s_out, V: tl.constexpr, VP: tl.constexpr,
            MASKS: tl.constexpr, MIN_NEW: tl.constexpr, GIVEN_NOISE: tl.constexpr,
            PDL: tl.constexpr):
    _after_previous(PDL)
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    idx = tl.arange(0, VP)
    valid = idx < V
    x = tl.load(logits_ptr + row.to(tl.int64) * s_l + idx, mask=valid,
                other=float("-inf")).to(tl.float32)
    count = tl.load(count_ptr + slot)
    if MASKS:  # the talker's processors (sampling.talker_scores)
        pen = tl.load(pen_ptr + slot)
        seen = tl.load(seen_ptr + slot * s_seen + idx, mask=valid, other=0) != 0
        x = tl.where(seen, tl.where(x < 0, x * pen, x / pen), x)
        x = tl.where((count < MIN_NEW) & (idx == eos_id), float("-inf"), x)
        x = tl.where(tl.load(sup_ptr + idx, mask=valid, other=0) != 0, float("-inf"), x)
    token = tl.argmax(x, 0)
    if tl.load(do_ptr + slot) != 0:  # greedy rows stop at the argmax
        token = _warp_and_race(x, valid, idx, temp_ptr, topk_ptr, topp_ptr, seed_ptr,
                               noise_ptr, row, slot, count + count_offset, stream, V,
                               GIVEN_NOISE)
    tl.store(out_ptr + row * s_out, token.to(tl.int64))


@dataclass
class TalkerMasks:
    """The talker's processors: per-slot seen mask (S, V) bool and penalty (S,), the
    suppressed ids (V,) bool, the codec EOS id (masked before MIN_NEW_TOKENS)."""

    seen: torch.Tensor
    penalty: torch.Tensor
    suppress: torch.Tensor
    eos_id: int


def sample(logits: torch.Tensor, slots: torch.Tensor, params: SamplingTensors,
           seed: torch.Tensor, count: torch.Tensor, count_offset: int, stream: int,
           masks: TalkerMasks | None = None, out: torch.Tensor | None = None,
           noise: torch.Tensor | None = None) -> torch.Tensor:
    """logits (B, V) of rows in `slots`; params, seed, count: per-slot tensors (S,). The
    noise counter of a row is count[slot] + count_offset (the frame number). -> tokens
    (B,) long, written into `out` (a (B,) view, e.g. a column of a frame) if given.
    `noise` (B, V) float32, contiguous, replaces the hashed Exp(1) noise: tests use it to
    put a chosen noise (a 0) under the race."""
    b, v = logits.shape
    vp = triton.next_power_of_2(v)
    if out is None:
        out = torch.empty(b, dtype=torch.long, device=logits.device)
    m = masks
    _sample[(b,)](
        logits, logits.stride(0), slots, params.do_sample, params.temperature, params.top_k,
        params.top_p, seed, count, count_offset, stream,
        m.seen if m else logits, m.seen.stride(0) if m else 0, m.penalty if m else logits,
        m.suppress if m else logits, m.eos_id if m else 0,
        noise if noise is not None else logits, out, out.stride(0),
        V=v, VP=vp, MASKS=m is not None, MIN_NEW=MIN_NEW_TOKENS,
        GIVEN_NOISE=noise is not None,
        **pdl_args(logits), num_warps=WARPS.get(vp, 4))
    return out
