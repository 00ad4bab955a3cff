"""Building blocks shared by the talker and the code predictor (Qwen3 decoder layers).

Numerics follow the official modules op for op (RMSNorm in float32 then cast, q/k RMSNorm
on the head dim, rotate-half RoPE with cos/sin computed in float32, SDPA), so greedy codes
match the official code token for token on the same weights.

M-RoPE note: the talker uses interleaved multimodal RoPE (sections [24, 20, 20]). For a
text/codec-only sequence the official code gives the temporal, height and width axes the
same position id (`get_rope_index` with no padding), and selecting per-channel from three
identical cos/sin tables is the identity. So the talker's rotary embedding is exactly the
1D RoPE implemented here; `mrope_section` is kept in the config for checkpoints only.

Static KV cache: `KVCache` holds (slots, kv_heads, max_len, head_dim) buffers, written in
place at each row's own positions, so decode shapes never change (CUDA-graph friendly).

Two paths run the same layers (`run_layers`): these modules op for op (CPU: the oracle's
numerics), and on CUDA the fused Triton kernels of `engine/kernels` over fused q|k|v and
gate|up weights (`fuse_projections`), carrying the residual stream beside the layer
output as vLLM does so each residual add rides in the next norm's kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # Same expression as transformers' default rope init (int64 arange, then float).
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (B, T) int -> cos, sin (B, T, head_dim) in `dtype` (computed in float32)."""
    freqs = (inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
             @ positions[:, None, :].float()).transpose(1, 2)  # (B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class KVCache(nn.Module):
    """Static KV cache of one attention layer.

    Layout: k, v (slots, kv_heads, max_len, head_dim). A step writes the new keys of row b
    at `positions[b]` of slot `slots[b]` and reads the first `kv_len` positions back; keys
    past a row's own position are masked by the caller. `reset` is not needed: a slot's
    stale keys are never read because the mask only admits positions <= the query's.
    """

    def __init__(self, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        super().__init__()
        shape = (slots, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device),
                             persistent=False)

    def update(self, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, kv_heads, T, D) into rows `slots` at positions (B, T) -> the rows'
        cache (B, kv_heads, kv_len, D)."""
        b_idx = slots[:, None].expand_as(positions)  # (B, T)
        self.k[b_idx, :, positions] = k.transpose(1, 2)  # index_put takes (B, T, H, D)
        self.v[b_idx, :, positions] = v.transpose(1, 2)
        return self.k[slots, :, :kv_len], self.v[slots, :, :kv_len]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float,
                 qk_norm: bool = True, bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.qkv_weight: torch.Tensor | None = None  # fuse_projections()

    def fuse_projections(self) -> None:
        """One (q|k|v) weight for one matmul; the three projections become views of it."""
        self.qkv_weight = _fuse(self.q_proj, self.k_proj, self.v_proj)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v  # (B, H, T, D), (B, KVH, T, D) x2

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """q (B, H, T, D), k/v (B, KVH, S, D), mask (B, 1, T, S) bool -> (B, T, hidden)."""
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             scale=self.head_dim ** -0.5)
        b, _, t, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # fuse_projections()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def fuse_projections(self) -> None:
        self.gate_up_weight = _fuse(self.gate_proj, self.up_proj)

    def down_fused(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The fused path's second half: down(SiLU(gate) * up) of the gate|up projection."""
        return kernels.linear(gate_up, self.down_proj.weight, act="silu_mul")


def _fuse(*linears: nn.Linear) -> torch.Tensor:
    """Concatenate bias-free Linear weights along the output dim; each module's weight
    becomes a view of the result (no second copy in memory, checkpoints still load)."""
    assert all(lin.bias is None for lin in linears)
    w = torch.cat([lin.weight.detach() for lin in linears])
    for lin, part in zip(linears, w.split([lin.out_features for lin in linears]),
                         strict=True):
        lin.weight.data = part
    return w


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int,
                 head_dim: int, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps)
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache, slots: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor, kv_len: int) -> torch.Tensor:
        attn = self.self_attn
        q, k, v = attn.qkv(self.input_layernorm(x), cos, sin)
        k, v = cache.update(slots, positions, k, v, kv_len)
        x = x + attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    @property
    def fused(self) -> bool:
        return self.mlp.gate_up_weight is not None

    def fuse_projections(self) -> None:
        self.self_attn.fuse_projections()
        self.mlp.fuse_projections()

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                      sin: torch.Tensor, cache: KVCache, slots: torch.Tensor,
                      positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer in fused kernels. The input is `x + residual` (residual None:
        x alone); returns (this layer's MLP output, the residual stream before it)."""
        attn, norm = self.self_attn, self.input_layernorm
        qkv, residual = kernels.norm_linear(x, residual, norm.weight, norm.eps,
                                            attn.qkv_weight)
        q = kernels.qk_norm_rope_write(
            qkv, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps, cos, sin, cache.k,
            cache.v, slots, positions, attn.heads)
        out = kernels.linear(kernels.attention(q, cache.k, cache.v, slots, positions,
                                               attn.head_dim ** -0.5), attn.o_proj.weight)
        norm, mlp = self.post_attention_layernorm, self.mlp
        gate_up, residual = kernels.norm_linear(out, residual, norm.weight, norm.eps,
                                                mlp.gate_up_weight)
        return mlp.down_fused(gate_up), residual


def run_layers(layers: nn.ModuleList, caches: nn.ModuleList, norm: RMSNorm, x: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """x (B, T, hidden) at positions (B, T) through the layers and the final norm, each
    row reading and writing cache slot slots[b]."""
    if layers[0].fused and kernels.active(x):
        residual = None
        for layer, cache in zip(layers, caches, strict=True):
            x, residual = layer.forward_fused(x, residual, cos, sin, cache, slots, positions)
        return kernels.rms_norm(x, norm.weight, norm.eps, residual)[0]
    mask = causal_mask(positions, kv_len)
    for layer, cache in zip(layers, caches, strict=True):
        x = layer(x, cos, sin, cache, slots, positions, mask, kv_len)
    return norm(x)


def head(lin: nn.Linear, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """A bias-free LM head: on the fused path, the small-batch GEMV (`kernels.linear`)."""
    return kernels.linear(x, lin.weight) if fused and kernels.active(x) else lin(x)


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """positions (B, T) -> (B, 1, T, kv_len) bool: key j visible to a query at p iff j <= p."""
    keys = torch.arange(kv_len, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)
