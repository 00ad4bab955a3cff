"""Matrix-vector products of the decode step (Triton): y = x W^T for 1 to 4 rows of x.

At batch 1-4 every projection of a decode step is bound by reading its weight (2-12 MB of
bf16) once, and cuBLAS's small-batch kernels (split-K, then a reduce kernel) reached about
45% of an H100's HBM bandwidth there. Here each program streams BLOCK_N whole rows of W
once, in BLOCK_K chunks pipelined STAGES deep, for all rows of x at once (the rows are
compile-time: one element-wise accumulator each, summed after the loop), in float32,
rounded once at the end as cuBLAS does: the result is F.linear's up to the order of the
float sums. `act="silu_mul"` also fuses the MLP's SiLU(gate) * up into the down
projection's K loop, rounded like `layer_ops.silu_mul`; `norm_linear` takes the layer's
[residual add +] RMSNorm of x inside the kernel, rounded like `layer_ops.rms_norm`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import active, pdl_args
from .layer_ops import _after_previous, _rnd
from .layer_ops import rms_norm as _rms_norm
from .layer_ops import silu_mul as _silu_mul

MAX_ROWS = 4  # rows of x (M) the kernel takes; more go to F.linear

Config = tuple[int, int, int, int]  # (BLOCK_N, BLOCK_K, num_warps, STAGES)

# (N, K, M, act) -> the fastest Config on an H100, or None where cuBLAS was as fast: pasted
# from bench/tune_gemv.py's output (H100 80GB HBM3, Triton 3.6; the 0.6B model's shapes:
# 1.1-1.85x cuBLAS's speed at M = 1, 2, 1.08-1.54x at M = 4 where not None). Shapes not
# listed use `_config`'s heuristic.
CONFIGS: dict[tuple[int, int, int, str | None], Config | None] = {
    (4096, 1024, 1, None): (2, 512, 2, 1),
    (4096, 1024, 2, None): (4, 256, 2, 3),
    (4096, 1024, 4, None): None,
    (1024, 2048, 1, None): (2, 2048, 8, 1),
    (1024, 2048, 2, None): (2, 1024, 4, 1),
    (1024, 2048, 4, None): (1, 1024, 2, 1),
    (6144, 1024, 1, None): (2, 512, 2, 1),
    (6144, 1024, 2, None): (4, 256, 2, 3),
    (6144, 1024, 4, None): None,
    (1024, 3072, 1, None): (4, 1024, 4, 3),
    (1024, 3072, 2, None): (2, 1024, 2, 3),
    (1024, 3072, 4, None): (2, 512, 2, 4),
    (1024, 3072, 1, "silu_mul"): (4, 1024, 4, 3),
    (1024, 3072, 2, "silu_mul"): (4, 1024, 4, 3),
    (1024, 3072, 4, "silu_mul"): (4, 1024, 4, 1),
    (2048, 1024, 1, None): (2, 1024, 4, 1),
    (2048, 1024, 2, None): (2, 512, 2, 1),
    (2048, 1024, 4, None): (8, 256, 2, 4),
    (3072, 1024, 1, None): (2, 512, 2, 1),
    (3072, 1024, 2, None): (2, 512, 2, 1),
    (3072, 1024, 4, None): (4, 256, 2, 3),
}


def _config(n: int, k: int, m: int, act: str | None = None) -> Config | None:
    """The tuned config of (n, k, m, act), else a heuristic from the tuning runs: one row
    of x wants many programs (2 rows of W each); more rows amortize each chunk of x over
    more rows of W; the fused SiLU-mul, recomputed by every program, wants fewer."""
    if (n, k, m, act) in CONFIGS:
        return CONFIGS[(n, k, m, act)]
    if act is not None:
        return 4, 1024, 4, 3
    if m == 1:
        return 2, 1024, 4, 1
    return (4, 256, 2, 3) if n >= 2048 else (2, 512, 2, 4)


@triton.jit
def _x_chunk(row_ptr, res_ptr, nw_ptr, inv, k, kmask, K, ACT: tl.constexpr,
             NORM: tl.constexpr, ADD: tl.constexpr, dt: tl.constexpr):
    """Columns k of one row of x as float32: of SiLU(gate) * up of a gate|up row (ACT; gate
    at 0..K, up at K..2K), or of RMSNorm(x [+ residual]) with the row's 1/rms `inv` (NORM),
    rounded like `layer_ops`' kernels."""
    if ACT:
        g = tl.load(row_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        u = tl.load(row_ptr + K + k, mask=kmask, other=0.0).to(tl.float32)
        return _rnd(_rnd(g / (1.0 + tl.exp(-g)), dt) * u, dt)
    else:
        x = tl.load(row_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            if ADD:
                x = _rnd(x + tl.load(res_ptr + k, mask=kmask, other=0.0).to(tl.float32), dt)
            w = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            x = _rnd(w * _rnd(x * inv, dt), dt)
        return x


@triton.jit
def _row_inv(row_ptr, res_ptr, h_ptr, K, eps, KP: tl.constexpr, ADD: tl.constexpr,
             dt: tl.constexpr):
    """1/rms of a row of x [+ residual] (RMSNorm's factor); program 0 also stores the sum
    (the new residual stream) at h_ptr."""
    c = tl.arange(0, KP)
    mask = c < K
    x = tl.load(row_ptr + c, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        x = _rnd(x + tl.load(res_ptr + c, mask=mask, other=0.0).to(tl.float32), dt)
        tl.store(h_ptr + c, x.to(dt), mask=mask & (tl.program_id(0) == 0))
    return tl.math.rsqrt(tl.sum(x * x, 0) / K + eps)


@triton.jit
def _w_chunk(w_rows, k, K, EVEN_K: tl.constexpr):
    """Columns k of the program's rows of W, as float32."""
    if EVEN_K:
        return tl.load(w_rows + k[None, :]).to(tl.float32)
    else:
        return tl.load(w_rows + k[None, :], mask=(k < K)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _accumulate(acc0, acc1, acc2, acc3, w, x0, x1, x2, x3, r_ptr, nw_ptr, inv0, inv1, inv2,
                inv3, k, K, M: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr,
                ADD: tl.constexpr, dt: tl.constexpr):
    """Adds W's chunk times columns k of each of the M rows of x to its accumulator."""
    kmask = k < K
    acc0 += w * _x_chunk(x0, r_ptr, nw_ptr, inv0, k, kmask, K, ACT, NORM, ADD, dt)[None, :]
    if M > 1:
        acc1 += w * _x_chunk(x1, r_ptr + K, nw_ptr, inv1, k, kmask, K, ACT, NORM, ADD,
                             dt)[None, :]
    if M > 2:
        acc2 += w * _x_chunk(x2, r_ptr + 2 * K, nw_ptr, inv2, k, kmask, K, ACT, NORM, ADD,
                             dt)[None, :]
    if M > 3:
        acc3 += w * _x_chunk(x3, r_ptr + 3 * K, nw_ptr, inv3, k, kmask, K, ACT, NORM, ADD,
                             dt)[None, :]
    return acc0, acc1, acc2, acc3


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, r_ptr, nw_ptr, h_ptr, eps, N, K, R, sx0, sx1, sw, sy,
          M: tl.constexpr, ACT: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr,
          KP: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    # Row m of x (A, R, K) is at x_ptr + (m // R) * sx0 + (m % R) * sx1; of the residual
    # and of h (the new residual), at r_ptr / h_ptr + m * K.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dt = y_ptr.dtype.element_ty
    # Rows past N re-read row N - 1 (no mask on the weight loads) and are not stored.
    w_rows = w_ptr + tl.minimum(n, N - 1).to(tl.int64)[:, None] * sw
    x0 = x_ptr + (0 // R) * sx0 + (0 % R) * sx1
    x1 = x_ptr + (1 // R) * sx0 + (1 % R) * sx1
    x2 = x_ptr + (2 // R) * sx0 + (2 % R) * sx1
    x3 = x_ptr + (3 // R) * sx0 + (3 % R) * sx1
    # Element-wise partial sums, reduced once after the loop: no cross-warp reduction (a
    # barrier) per chunk. STAGES > 1 pipelines the loop's loads through shared memory
    # (cp.async), to keep more of W in flight (the tuner picks; 1: plain loads).
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    # The first chunk of W is loaded before waiting for the previous kernel (the weight is
    # never written during a step): under PDL it streams in while that kernel finishes.
    k = tl.arange(0, BLOCK_K)
    w = _w_chunk(w_rows, k, K, EVEN_K)
    _after_previous(PDL)
    # RMSNorm of x [+ residual] before the projection (NORM): every program takes each
    # row's 1/rms in a pass over the row (a few KB, from L2), instead of a norm kernel
    # between the projections.
    inv0 = 1.0
    inv1 = 1.0
    inv2 = 1.0
    inv3 = 1.0
    if NORM:
        inv0 = _row_inv(x0, r_ptr, h_ptr, K, eps, KP, ADD, dt)
        if M > 1:
            inv1 = _row_inv(x1, r_ptr + K, h_ptr + K, K, eps, KP, ADD, dt)
        if M > 2:
            inv2 = _row_inv(x2, r_ptr + 2 * K, h_ptr + 2 * K, K, eps, KP, ADD, dt)
        if M > 3:
            inv3 = _row_inv(x3, r_ptr + 3 * K, h_ptr + 3 * K, K, eps, KP, ADD, dt)
    acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, x0, x1, x2, x3, r_ptr,
                                         nw_ptr, inv0, inv1, inv2, inv3, k, K, M, ACT, NORM,
                                         ADD, dt)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        w = _w_chunk(w_rows, k, K, EVEN_K)
        acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, x0, x1, x2, x3,
                                             r_ptr, nw_ptr, inv0, inv1, inv2, inv3, k, K, M,
                                             ACT, NORM, ADD, dt)
    out = y_ptr + n
    live = n < N
    tl.store(out, tl.sum(acc0, 1).to(dt), mask=live)
    if M > 1:
        tl.store(out + sy, tl.sum(acc1, 1).to(dt), mask=live)
    if M > 2:
        tl.store(out + 2 * sy, tl.sum(acc2, 1).to(dt), mask=live)
    if M > 3:
        tl.store(out + 3 * sy, tl.sum(acc3, 1).to(dt), mask=live)


def _reference(x: torch.Tensor, w: torch.Tensor, act: str | None) -> torch.Tensor:
    if act is not None:
        if active(x):
            x = _silu_mul(x)
        else:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
    return F.linear(x, w)


def _rows(x: torch.Tensor, w: torch.Tensor, act: str | None,
          config: Config | None) -> tuple[int, Config] | None:
    """(rows of x, config) where the kernel runs for x @ w^T, else None (plain ops)."""
    n, k = w.shape
    if x.shape[-1] != (2 * k if act else k):
        raise ValueError(f"x {tuple(x.shape)} does not fit w {tuple(w.shape)} (act {act})")
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not (0 < m <= MAX_ROWS and active(x) and x.dtype == w.dtype and w.stride(1) == 1
            and n > 0):
        return None
    config = config or _config(n, k, m, act)
    return None if config is None else (m, config)  # None: cuBLAS is faster here


def _launch(x: torch.Tensor, w: torch.Tensor, m: int, config: Config, act: str | None,
            norm: tuple[torch.Tensor, float] | None = None,
            add: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The GEMV of x (m rows) by w, with RMSNorm (weight, eps) of x first (`norm`), of
    x + residual (`add` = (residual, h): h gets the sum; both contiguous (m, K))."""
    n, k = w.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    # As (A, R, K): a view of any 1-3-D x (a copy only for a > 3-D x that cannot be one).
    x3 = x.view(1, 1, -1) if x.dim() == 1 else x.unsqueeze(0) if x.dim() == 2 else \
        x.reshape(-1, *x.shape[-2:])
    block_n, block_k, num_warps, stages = config
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    nw, eps = norm if norm is not None else (y, 0.0)
    r, h = add if add is not None else (y, y)
    _gemv[(triton.cdiv(n, block_n),)](
        x3, w, y, r, nw, h, eps, n, k, x3.shape[1], x3.stride(0), x3.stride(1), w.stride(0),
        y.stride(0), M=m, ACT=act is not None, NORM=norm is not None, ADD=add is not None,
        KP=triton.next_power_of_2(k), EVEN_K=k % block_k == 0, BLOCK_N=block_n,
        BLOCK_K=block_k, STAGES=stages, **pdl_args(x), num_warps=num_warps)
    return y.view(*x.shape[:-1], n)


def linear(x: torch.Tensor, w: torch.Tensor, act: str | None = None, *,
           config: Config | None = None) -> torch.Tensor:
    """F.linear(x, w) for x (..., K) and w (N, K) of x's dtype (rows of w contiguous), or
    with act="silu_mul" F.linear(silu_mul(x), w) for a gate|up x (..., 2K). The kernel runs
    for up to MAX_ROWS rows of x where `active(x)` (unless CONFIGS says cuBLAS is faster);
    otherwise the plain ops do. `config` overrides CONFIGS (bench/tune_gemv.py)."""
    if act not in (None, "silu_mul"):
        raise ValueError(f"unknown act {act!r}")
    fit = _rows(x, w, act, config)
    return _reference(x, w, act) if fit is None else _launch(x, w, *fit, act)


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, w: torch.Tensor, *, config: Config | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`layer_ops.rms_norm(x, norm_weight, eps, residual)` then `linear` of the normed x:
    -> (F.linear(normed, w), the un-normed input: x, or x + residual). Where the GEMV runs,
    the norm is taken inside it (no kernel of its own)."""
    fit = _rows(x, w, None, config)
    if fit is None:
        normed, h = _rms_norm(x, norm_weight, eps, residual)
        return linear(normed, w, config=config), h
    if residual is None:
        return _launch(x, w, *fit, None, (norm_weight, eps)), x
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    add = (residual.contiguous(), h)
    return _launch(x, w, *fit, None, (norm_weight, eps), add), h
