"""The 12 Hz speech-tokenizer decoder: codes (B, 16, T) -> 24 kHz PCM (B, T * 1920).

Everything in it is causal: the RVQ lookup and the pointwise layers are per frame, every
convolution is left-padded (stride 1), every transposed convolution only reaches forward
by its kernel, and the small transformer uses a causal sliding window of 72 frames. So it
can stream *exactly*: instead of re-decoding a left context, each stateful op carries its
own state between packets:

- causal conv (kernel k, dilation d): the last (k - 1) * d input samples (zeros at start,
  which is exactly the official zero padding);
- transposed conv (kernel K, stride S): the last ceil(K / S) - 1 input frames; the first
  (ceil(K / S) - 1) * S output samples of a packet are the previous packet's (dropped);
- transformer layer: the keys/values of the last `sliding_window - 1` frames (with RoPE
  at their absolute positions) and the frame counter.

Decoding a whole utterance is the same code with one packet, so "streaming == offline"
holds by construction up to float rounding (tests: max abs diff <= 1e-4, SNR >= 60 dB vs
the official one-shot decode). The official `chunked_decode` re-decodes 300-frame chunks
with 25 frames of left context instead; for utterances under 300 frames (24 s) both are a
single forward. State is a `DecoderState` (one stream of B rows, grown as it goes) or, in
the engine, rows of a `DecoderSlots` (one row per session slot, fixed tensors: a batch of
sessions decodes its next frame in one call, captured in a CUDA graph).

Attribute names mirror `decoder.*` of the official speech-tokenizer checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..config import SpeechDecoderConfig
from .layers import MLP, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq


@dataclass
class DecoderState:
    """Streaming state of one decode stream (B rows decoding in lockstep). `bufs` is filled
    in call order by the stateful ops on the first packet and updated in place of the list
    afterwards."""

    bufs: list[torch.Tensor] = field(default_factory=list)
    frames: int = 0  # frames decoded so far (the next frame's RoPE position)
    _cursor: int = 0

    def begin(self) -> None:
        self._cursor = 0

    def take(self, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._cursor == len(self.bufs):
            self.bufs.append(make())
        return self.bufs[self._cursor]

    def put(self, t: torch.Tensor) -> None:
        self.bufs[self._cursor] = t
        self._cursor += 1

    def positions(self, b: int, t: int, device: torch.device) -> torch.Tensor:
        return torch.arange(self.frames, self.frames + t, device=device)[None].expand(b, -1)

    def advance(self, t: int) -> None:
        self.frames += t


class DecoderSlots:
    """The streaming state of many streams, one row per engine slot, in fixed tensors:
    a batched decode of any set of slots is a pure function of tensors (gather the rows'
    state, decode, scatter it back), so it can be captured in a CUDA graph. Buffer shapes
    are found by one probe decode. Rows that repeat a slot (graph padding) may only use a
    scratch slot: their write-backs race."""

    def __init__(self, decoder: SpeechDecoder, slots: int, device: torch.device) -> None:
        probe = DecoderState()
        dtype = next(decoder.parameters()).dtype
        with torch.no_grad():
            decoder(torch.zeros(1, decoder.cfg.num_quantizers, 1, dtype=torch.long,
                                device=device), probe)
        self.bufs = [torch.zeros((slots, *b.shape[1:]), dtype=dtype, device=device)
                     for b in probe.bufs]
        self.frames = torch.zeros(slots, dtype=torch.long, device=device)

    def reset(self, slots: torch.Tensor) -> None:
        """New utterances in `slots`: zero history (the official zero padding)."""
        for b in (*self.bufs, self.frames):
            b.index_fill_(0, slots, 0)

    def rows(self, slots: torch.Tensor) -> SlotRows:
        return SlotRows(self, slots)

    def save(self, slot: int) -> list[torch.Tensor]:
        """A copy of one slot's state (`load` puts it back into any slot)."""
        return [b[slot].clone() for b in (*self.bufs, self.frames)]

    def load(self, slots: torch.Tensor, state: list[torch.Tensor]) -> None:
        for b, s in zip((*self.bufs, self.frames), state, strict=True):
            b.index_copy_(0, slots, s[None].expand(len(slots), *s.shape))


class SlotRows:
    """A `DecoderState` over rows `slots` of a `DecoderSlots`."""

    def __init__(self, pool: DecoderSlots, slots: torch.Tensor) -> None:
        self.pool, self.slots, self._cursor = pool, slots, 0

    def begin(self) -> None:
        self._cursor = 0

    def take(self, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        return self.pool.bufs[self._cursor][self.slots]

    def put(self, t: torch.Tensor) -> None:
        self.pool.bufs[self._cursor].index_copy_(0, self.slots, t)
        self._cursor += 1

    def positions(self, b: int, t: int, device: torch.device) -> torch.Tensor:
        return self.pool.frames[self.slots][:, None] + torch.arange(t, device=device)

    def advance(self, t: int) -> None:
        self.pool.frames.index_copy_(0, self.slots, self.pool.frames[self.slots] + t)


StreamState = DecoderState | SlotRows


class CausalConv(nn.Module):
    """Official `Qwen3TTSTokenizerV2CausalConvNet` (stride 1 only: all the decoder uses)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        if self.pad == 0:
            return self.conv(x)
        prev = st.take(lambda: x.new_zeros(x.shape[0], x.shape[1], self.pad))
        x = torch.cat((prev, x), dim=-1)  # (B, C, pad + T)
        st.put(x[..., -self.pad:])
        return self.conv(x)


class CausalTransConv(nn.Module):
    """Official `Qwen3TTSTokenizerV2CausalTransConvNet`: ConvTranspose1d, right-trimmed."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.trim = stride, kernel - stride
        self.overlap = math.ceil(kernel / stride) - 1  # input frames carried over

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        t = x.shape[-1]
        if self.overlap:
            prev = st.take(lambda: x.new_zeros(x.shape[0], x.shape[1], self.overlap))
            x = torch.cat((prev, x), dim=-1)
            st.put(x[..., -self.overlap:])
        y = self.conv(x)
        if self.trim:
            y = y[..., : y.shape[-1] - self.trim]
        return y[..., y.shape[-1] - t * self.stride:]


class SnakeBeta(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.active(x):
            return kernels.snake_beta(x, self.alpha, self.beta)
        alpha = torch.exp(self.alpha.unsqueeze(0).unsqueeze(-1))
        beta = torch.exp(self.beta.unsqueeze(0).unsqueeze(-1))
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        h = self.dwconv(x, st).permute(0, 2, 1)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 2, 1)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), st)), st)


class DecoderBlock(nn.Module):
    def __init__(self, cfg: SpeechDecoderConfig, i: int) -> None:
        super().__init__()
        cin, cout = cfg.decoder_dim // 2 ** i, cfg.decoder_dim // 2 ** (i + 1)
        rate = cfg.upsample_rates[i]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
                                   + [ResidualUnit(cout, d) for d in (1, 3, 9)])

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        x = self.block[1](self.block[0](x), st)
        for unit in self.block[2:]:
            x = unit(x, st)
        return x


# --- residual vector quantizer (decode only) ---------------------------------------------

class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        embedding = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, embedding)


class VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class RVQ(nn.Module):
    def __init__(self, size: int, dim: int, n_q: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VQLayer(size, dim) for _ in range(n_q))


class ResidualVQ(nn.Module):
    """Official `ResidualVectorQuantizer` with force_projection (decode half)."""

    def __init__(self, size: int, dim: int, io_dim: int, n_q: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoder side, unused
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = RVQ(size, dim, n_q)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, n_q, T) -> (B, io_dim, T)."""
        q = torch.zeros([1], device=codes.device, dtype=self.output_proj.weight.dtype)[0]
        for i, layer in enumerate(self.vq.layers):
            q = q + layer._codebook.decode(codes[:, i]).transpose(1, 2)
        return self.output_proj(q)


class SplitRVQ(nn.Module):
    def __init__(self, cfg: SpeechDecoderConfig) -> None:
        super().__init__()
        half = cfg.codebook_dim // 2
        self.rvq_first = ResidualVQ(cfg.codebook_size, half, cfg.codebook_dim, 1)
        self.rvq_rest = ResidualVQ(cfg.codebook_size, half, cfg.codebook_dim,
                                   cfg.num_quantizers - 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        q = self.rvq_first.decode(codes[:, :1])
        return q + self.rvq_rest.decode(codes[:, 1:])


# --- the small transformer (sliding window, streamed with a KV window) -------------------

class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))


class WindowAttention(nn.Module):
    def __init__(self, cfg: SpeechDecoderConfig) -> None:
        super().__init__()
        h, d = cfg.num_attention_heads, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = h, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.window = cfg.sliding_window

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, st: StreamState) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        w = self.window - 1
        kv = st.take(lambda: k.new_zeros(b, 2, self.kv_heads, w, self.head_dim))
        k = torch.cat((kv[:, 0], k), dim=2)  # (B, KVH, w + T, D)
        v = torch.cat((kv[:, 1], v), dim=2)
        st.put(torch.stack((k[:, :, -w:], v[:, :, -w:]), dim=1))
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: SpeechDecoderConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask, st: StreamState) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), cos, sin, mask, st)
        x = x + self.self_attn_layer_scale.scale * h
        h = self.mlp(self.post_attention_layernorm(x))
        return x + self.mlp_layer_scale.scale * h


class PreTransformer(nn.Module):
    def __init__(self, cfg: SpeechDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)
        self.window = cfg.sliding_window

    def forward(self, x: torch.Tensor, st: StreamState) -> torch.Tensor:
        """x (B, T, latent) -> (B, T, latent), the next T frames of each row's stream."""
        b, t, _ = x.shape
        x = self.input_proj(x)
        positions = st.positions(b, t, x.device)  # (B, T) absolute frame numbers
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        w = self.window - 1
        # Key m of [window buffer (w), new (t)] has absolute position start - w + m.
        q_pos = positions[:, :, None]  # (B, T, 1)
        k_pos = positions[:, :1, None] - w + torch.arange(w + t, device=x.device)  # (B, 1, w+T)
        mask = (k_pos >= 0) & (k_pos <= q_pos) & (q_pos - k_pos < self.window)
        mask = mask[:, None]  # (B, 1, T, w + T)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, st)
        return self.output_proj(self.norm(x))


class SpeechDecoder(nn.Module):
    """Official `Qwen3TTSTokenizerV2Decoder` with streaming state."""

    def __init__(self, cfg: SpeechDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, f, f),
                           ConvNeXtBlock(cfg.latent_dim)]) for f in cfg.upsampling_ratios)
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        self.decoder = nn.ModuleList(
            [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [DecoderBlock(cfg, i) for i in range(len(cfg.upsample_rates))]
            + [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)])

    allow_tf32 = False

    def set_precision(self, precision: str) -> None:
        """"fp32" (default, exact), "tf32" or "bf16": see `_precision` and EngineSettings."""
        self.allow_tf32 = precision == "tf32"
        self.to(torch.bfloat16 if precision == "bf16" else torch.float32)

    def forward(self, codes: torch.Tensor, st: StreamState | None = None) -> torch.Tensor:
        """codes (B, 16, T) int -> pcm (B, T * frame_samples) float32. With `st`, continue the
        stream it holds (and advance it); without, decode these frames as a whole utterance."""
        with _precision(codes.device, self.allow_tf32):
            return self._forward(codes, st if st is not None else DecoderState()).float()

    def _forward(self, codes: torch.Tensor, st: StreamState) -> torch.Tensor:
        st.begin()
        h = self.quantizer.decode(codes)  # (B, codebook_dim, T)
        h = self.pre_conv(h, st).transpose(1, 2)
        h = self.pre_transformer(h, st).permute(0, 2, 1)  # (B, latent, T)
        for trans, convnext in self.upsample:
            h = convnext(trans(h, st), st)
        h = self.decoder[0](h, st)
        for block in self.decoder[1:-2]:
            h = block(h, st)
        h = self.decoder[-1](self.decoder[-2](h), st)
        st.advance(codes.shape[-1])
        return h.clamp(min=-1, max=1).squeeze(1)


@contextmanager
def _precision(device: torch.device, tf32: bool) -> Iterator[None]:
    """The decoder's TF32 setting for cuDNN convolutions and matmuls. Measured on an H100
    at the released shape (100 frames, packets 1 then 4, vs one whole decode): float32
    with TF32 convs 61 dB SNR, without 111 dB; bfloat16 36 dB. By default the decoder runs
    in float32 with TF32 off (process-wide flags, restored after; the engine thread is
    torch's only user)."""
    if device.type != "cuda":
        yield
        return
    prev = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
