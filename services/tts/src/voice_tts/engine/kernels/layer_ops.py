"""Fused element-wise parts of a Qwen3 decoder layer (Triton): one launch each.

Rounding follows the reference modules in `model/layers.py` op for op: where PyTorch
rounds an intermediate to the model dtype (bf16), `_rnd` rounds it here, so results
differ from the reference only by the order of float sums in the norms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import pdl_args

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control: `pdl` says False
    gdc_launch_dependents = gdc_wait = None  # type: ignore[assignment]


@triton.jit
def _after_previous(PDL: tl.constexpr):
    """Under programmatic dependent launch: wait until the stream's previous kernel is
    done and its writes are visible, then let the next kernel launch (it waits the same
    way). Every kernel launched with PDL calls this before it touches step data."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _rnd(x, dtype: tl.constexpr):
    """Round to the model dtype and compute on in float32 (what a PyTorch op on bf16 does)."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rms_norm(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, sx, sr, sy, sh, eps,
              N: tl.constexpr, BLOCK: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr):
    _after_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < N
    dt = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * sx + c, mask=mask, other=0.0).to(tl.float32)
    if ADD:  # x + residual, rounded like the reference's add, kept as the new residual
        x = _rnd(x + tl.load(r_ptr + row * sr + c, mask=mask, other=0.0).to(tl.float32), dt)
        tl.store(h_ptr + row * sh + c, x.to(dt), mask=mask)
    inv = tl.math.rsqrt(tl.sum(x * x, 0) / N + eps)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sy + c, (w * _rnd(x * inv, dt)).to(dt), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x (..., N), or of x + residual. -> (normed, the un-normed input: x, or
    the new residual x + residual)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty_like(x2)
    h = torch.empty_like(x2) if residual is not None else x2
    r2 = residual.reshape(-1, n) if residual is not None else x2
    _rms_norm[(x2.shape[0],)](x2, r2, weight, y, h, x2.stride(0), r2.stride(0), y.stride(0),
                              h.stride(0), eps, N=n, BLOCK=triton.next_power_of_2(n),
                              ADD=residual is not None, **pdl_args(x))
    return y.view(x.shape), h.view(x.shape)


@triton.jit
def _qk_norm_rope_write(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, slots_ptr, pos_ptr,
                        q_ptr, kc_ptr, vc_ptr, T, s_qkv, s_cb, s_ct, s_pb, s_pt, s_qm, s_qh,
                        s_cs, s_ch, s_cl, eps, H: tl.constexpr, KVH: tl.constexpr,
                        D: tl.constexpr, NH_PAD: tl.constexpr, PDL: tl.constexpr):
    _after_previous(PDL)
    m = tl.program_id(0)  # one token row: all its q, k and v heads, as (heads, D/2) halves
    b, t = m // T, m % T
    dt = q_ptr.dtype.element_ty
    hd = tl.arange(0, NH_PAD)[:, None]  # head index: q heads, then k heads, then v heads
    half = tl.arange(0, D // 2)[None, :]
    is_q, is_k = hd < H, (hd >= H) & (hd < H + KVH)
    is_v = (hd >= H + KVH) & (hd < H + 2 * KVH)
    src = qkv_ptr + m.to(tl.int64) * s_qkv + hd * D + half
    live = hd < H + 2 * KVH
    x1 = tl.load(src, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + D // 2, mask=live, other=0.0).to(tl.float32)
    # Per-head RMSNorm (q_norm on q heads, k_norm on k heads), then rotate-half RoPE.
    w1 = tl.where(is_q, tl.load(qw_ptr + half), tl.load(kw_ptr + half)).to(tl.float32)
    w2 = tl.where(is_q, tl.load(qw_ptr + D // 2 + half),
                  tl.load(kw_ptr + D // 2 + half)).to(tl.float32)
    inv = tl.math.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
    y1 = _rnd(w1 * _rnd(x1 * inv, dt), dt)
    y2 = _rnd(w2 * _rnd(x2 * inv, dt), dt)
    c = tl.load(cos_ptr + b * s_cb + t * s_ct + half).to(tl.float32)  # the halves are equal
    s = tl.load(sin_ptr + b * s_cb + t * s_ct + half).to(tl.float32)
    o1 = (_rnd(y1 * c, dt) + _rnd(-y2 * s, dt)).to(dt)
    o2 = (_rnd(y2 * c, dt) + _rnd(y1 * s, dt)).to(dt)
    q_dst = q_ptr + m.to(tl.int64) * s_qm + hd * s_qh + half
    tl.store(q_dst, o1, mask=is_q)
    tl.store(q_dst + D // 2, o2, mask=is_q)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt)
    at = slot * s_cs + pos * s_cl + half
    k_dst = kc_ptr + at + (hd - H) * s_ch
    tl.store(k_dst, o1, mask=is_k)
    tl.store(k_dst + D // 2, o2, mask=is_k)
    v_dst = vc_ptr + at + (hd - H - KVH) * s_ch
    tl.store(v_dst, x1.to(dt), mask=is_v)
    tl.store(v_dst + D // 2, x2.to(dt), mask=is_v)


def qk_norm_rope_write(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                       eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                       positions: torch.Tensor, heads: int) -> torch.Tensor:
    """qkv (B, T, (H + 2 KVH) * D) from the fused projection; cos/sin (B, T, D) (strides may
    be 0); caches (S, KVH, L, D); slots (B,); positions (B, T). Writes the rows' normed,
    rotated keys and their values into the cache -> q (B, T, H, D), normed and rotated."""
    b, t, _ = qkv.shape
    kvh, d = k_cache.shape[1], k_cache.shape[3]
    qkv2 = qkv.reshape(b * t, -1)
    q = torch.empty(b * t, heads, d, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_write[(b * t,)](
        qkv2, q_weight, k_weight, cos, sin, slots, positions, q, k_cache, v_cache, t,
        qkv2.stride(0), cos.stride(0), cos.stride(1), positions.stride(0),
        positions.stride(1), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), eps, H=heads, KVH=kvh, D=d,
        NH_PAD=triton.next_power_of_2(heads + 2 * kvh), **pdl_args(qkv))
    return q.view(b, t, heads, d)


@triton.jit
def _silu_mul(gu_ptr, y_ptr, s_gu, s_y, N: tl.constexpr, BLOCK: tl.constexpr):
    row, blk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    c = blk * BLOCK + tl.arange(0, BLOCK)
    mask = c < N
    dt = y_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * s_gu + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gu + N + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * s_y + c, (_rnd(g / (1.0 + tl.exp(-g)), dt) * u).to(dt), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (..., 2N) -> SiLU(gate) * up (..., N)."""
    n = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * n)
    y = torch.empty(gu.shape[0], n, dtype=gu.dtype, device=gu.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul[(gu.shape[0], triton.cdiv(n, block))](gu, y, gu.stride(0), y.stride(0), N=n,
                                                     BLOCK=block)
    return y.view(*gate_up.shape[:-1], n)


@triton.jit
def _snake_beta(x_ptr, a_ptr, b_ptr, y_ptr, C, T, BLOCK: tl.constexpr):
    row, blk = tl.program_id(0).to(tl.int64), tl.program_id(1)  # row: (batch, channel)
    c = row % C
    t = blk * BLOCK + tl.arange(0, BLOCK)
    mask = t < T
    dt = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * T + t, mask=mask, other=0.0).to(tl.float32)
    alpha = _rnd(tl.exp(tl.load(a_ptr + c).to(tl.float32)), dt)
    inv = _rnd(1.0 / _rnd(_rnd(tl.exp(tl.load(b_ptr + c).to(tl.float32)), dt) + 1e-9, dt), dt)
    s = _rnd(tl.sin(_rnd(x * alpha, dt)), dt)
    tl.store(y_ptr + row * T + t, (x + _rnd(inv * _rnd(s * s, dt), dt)).to(dt), mask=mask)


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The speech decoder's SnakeBeta, x + 1 / (e^beta + 1e-9) * sin(e^alpha * x)^2, with
    per-channel alpha, beta (C,) on x (B, C, T): nine element-wise ops in one launch."""
    x = x.contiguous()
    b, c, t = x.shape
    y = torch.empty_like(x)
    block = min(1024, triton.next_power_of_2(t))
    _snake_beta[(b * c, triton.cdiv(t, block))](x, alpha, beta, y, c, t, BLOCK=block)
    return y
