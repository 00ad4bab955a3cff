"""Decode attention on CUDA (Triton): one query row per sequence, read in place from its
slot of a static KV cache.

The eager path (`Attention.attend`) gathers each row's cache slot (B, kv_heads, kv_len, D),
repeats it for grouped-query heads and runs SDPA over the full `kv_len` with a mask: in a
CUDA graph kv_len is the whole cache, so at 64 sessions the talker copied ~30 GB a step.
This kernel reads only the row's own keys (0 .. length-1) straight from the cache, once
per kv head for all the query heads that share it (online softmax, fp32 accumulation).
Same function as SDPA up to the order of float sums (tests/engine/test_graphs_gpu.py).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path is used
    triton = None

AVAILABLE = triton is not None

if AVAILABLE:
    @triton.jit
    def _decode_attention(q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, lens_ptr,
                          sq_b, sq_h, sk_s, sk_h, sk_l, so_b, so_h, scale,
                          REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr,
                          BLOCK_N: tl.constexpr, PREC: tl.constexpr):
        b, kvh = tl.program_id(0), tl.program_id(1)
        slot = tl.load(slots_ptr + b)
        n = tl.load(lens_ptr + b)
        r = tl.arange(0, REP_PAD)
        d = tl.arange(0, D)
        heads = kvh * REP + r
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :],
                    mask=(r < REP)[:, None], other=0.0)
        m = tl.full([REP_PAD], float("-inf"), tl.float32)
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
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            den = den * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + ptrs, mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m = m_new
        out = acc / den[:, None]
        tl.store(o_ptr + b * so_b + heads[:, None] * so_h + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=(r < REP)[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slots: torch.Tensor, lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """q (B, H, 1, D); caches (S, KVH, L, D); slots, lengths (B,) long: row b attends to
    keys 0..lengths[b]-1 of slot slots[b]. -> (B, 1, H * D)."""
    b, h, _, d = q.shape
    kvh = k_cache.shape[1]
    rep = h // kvh
    out = torch.empty(b, h, d, dtype=q.dtype, device=q.device)
    block_n = min(64, max(16, triton.next_power_of_2(k_cache.shape[2])))
    _decode_attention[(b, kvh)](
        q, k_cache, v_cache, out, slots, lengths,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), scale,
        REP=rep, REP_PAD=max(16, triton.next_power_of_2(rep)), D=d, BLOCK_N=block_n,
        PREC="ieee" if q.dtype == torch.float32 else "tf32")  # exact fp32 when asked for
    return out.view(b, 1, h * d)
