"""Causal attention over a static KV cache, read in place from each row's slot (Triton).

The plain path (`Attention.attend`) gathers each row's cache slot (B, kv_heads, kv_len, D),
repeats it for grouped-query heads and runs SDPA over the full `kv_len` with a mask: in a
CUDA graph kv_len is the whole cache, so at 64 sessions the talker copied ~30 GB a step.
Here each query row (b, t) reads only its own keys 0..positions[b, t] straight from slot
slots[b], once per kv head for all the query heads that share it (online softmax, fp32
accumulation). One query row per sequence is a decode step; T rows at positions
p..p+T-1 are a causal prefill. The keys of all T rows must be in the cache already
(`qk_norm_rope_write`). Same function as SDPA up to the order of float sums
(tests/engine/test_kernels.py, test_graphs_gpu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import pdl_args
from .layer_ops import _after_previous


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, pos_ptr, T,
               sq_b, sq_t, sq_h, sp_b, sp_t, sk_s, sk_h, sk_l, so_m, so_h, scale,
               REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
               BLOCK_N: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    _after_previous(PDL)
    m, kvh = tl.program_id(0), tl.program_id(1)
    b, t = m // T, m % T
    slot = tl.load(slots_ptr + b)
    n = tl.load(pos_ptr + b * sp_b + t * sp_t) + 1  # keys 0..position: causal
    r = tl.arange(0, REP_PAD)
    d = tl.arange(0, D)
    heads = kvh * REP + r
    q = tl.load(q_ptr + b * sq_b + t * sq_t + heads[:, None] * sq_h + d[None, :],
                mask=(r < REP)[:, None], other=0.0)
    mx = tl.full([REP_PAD], float("-inf"), tl.float32)
    den = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D], tl.float32)
    base = slot.to(tl.int64) * sk_s + kvh * sk_h
    for start in range(0, n, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < n
        ptrs = base + offs[:, None] * sk_l + d[None, :]
        k = tl.load(k_ptr + ptrs, mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(mx, tl.max(s, 1))
        alpha = tl.exp(mx - m_new)
        p = tl.exp(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + ptrs, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        mx = m_new
    out = acc / den[:, None]
    tl.store(o_ptr + m * so_m + heads[:, None] * so_h + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(r < REP)[:, None])


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slots: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """q (B, T, H, D) (any strides, last dim contiguous); caches (S, KVH, L, D);
    slots (B,), positions (B, T) long: row (b, t) attends to keys 0..positions[b, t] of
    slot slots[b]. -> (B, T, H * D)."""
    b, t, h, d = q.shape
    kvh = k_cache.shape[1]
    rep = h // kvh
    out = torch.empty(b * t, h, d, dtype=q.dtype, device=q.device)
    block_n = min(64, max(16, triton.next_power_of_2(k_cache.shape[2])))
    _attention[(b * t, kvh)](
        q, k_cache, v_cache, out, slots, positions, t,
        q.stride(0), q.stride(1), q.stride(2), positions.stride(0), positions.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1),
        scale, REP=rep, REP_PAD=max(16, triton.next_power_of_2(rep)), D=d, BLOCK_N=block_n,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # exact fp32 when asked for
        **pdl_args(q))
    return out.view(b, t, h * d)
