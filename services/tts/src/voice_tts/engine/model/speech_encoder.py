"""The 12 Hz speech tokenizer's encoder: 24 kHz audio -> reference codes (T, 16) for cloning.

The official `Qwen3TTSTokenizerV2Model.encode` runs transformers' `MimiModel` minus its
decoder; this is that encoder in plain PyTorch, op for op:

- `encoder`: the SEANet conv stack (causal convs, ELU, residual blocks, strided convs of
  ratios 4, 5, 6, 8 -> hop 960, 25 Hz). Every conv is left-padded by (kernel - stride) and
  right-padded up to a whole number of strides, with zeros (`pad_mode` "constant");
- `encoder_transformer`: pre-LayerNorm layers (RoPE attention, GELU MLP, layer scales),
  causal over the whole sequence: `Qwen3TTSTokenizer.from_pretrained` calls
  `restore_mimi_full_attention`, which widens Mimi's 250-frame sliding window to
  `max_position_embeddings` ("as transformers 4.57.3 did"). The two differ only for
  references over 10 s (250 frames at 25 Hz); we follow the official loader;
- `downsample`: a stride-2 conv (kernel 4, replicate padding) -> 12.5 Hz;
- `quantizer`: split residual VQ (1 semantic + 31 acoustic codebooks), nearest code by
  `torch.cdist` in float32 against `embed_sum / cluster_usage.clamp(1e-5)`. Only the first
  `valid_num_quantizers` (16) codebooks are kept, so only those are computed (residual VQ is
  sequential: the first 16 do not depend on the rest).

Codes are trimmed to ceil(samples / 1920) frames as the official `encode`. Voice creation is
off the hot path: this runs eager, in float32. Attribute names mirror `encoder.*` of the
official speech-tokenizer checkpoint (weights load by a prefix strip; unused decoder-side
weights such as `output_proj` are still held so the load is strict).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import SpeechEncoderConfig
from .layers import apply_rope, rope_cos_sin, rope_inv_freq
from .speech_decoder import _precision


class WithSpeechEncoder(Protocol):
    """What `reference_codes` reads of `Qwen3TTS` (which imports this module)."""

    speech_encoder: SpeechEncoder | None


class CausalConv1d(nn.Module):
    """Mimi's causal conv: pad (kernel - stride) on the left and, on the right, up to the
    next whole stride, so the output has ceil(length / stride) frames."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, pad_mode: str = "constant") -> None:
        super().__init__()
        if pad_mode not in ("constant", "replicate"):
            raise ValueError(f"unsupported pad_mode {pad_mode!r}")
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.padding_total = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = -x.shape[-1] % self.stride
        return self.conv(F.pad(x, (self.padding_total, extra), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    """SEANet residual unit: ELU, conv k3 (dim -> dim / compress), ELU, conv k1, + input."""

    def __init__(self, cfg: SpeechEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([
            nn.ELU(), CausalConv1d(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
            nn.ELU(), CausalConv1d(hidden, dim, 1)])
        self.shortcut = CausalConv1d(dim, dim, 1) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return self.shortcut(x) + y


class SeanetEncoder(nn.Module):
    """Audio (B, 1, N) -> (B, hidden, ceil-ish(N / 960)). `layers` keeps the ELUs so the
    indices match the checkpoint's (`layers.0`, `layers.1.block.1`, `layers.3`, ...)."""

    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(cfg.audio_channels, cfg.num_filters,
                                                cfg.kernel_size)]
        dim = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate ** j)
                       for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv1d(dim, 2 * dim, 2 * ratio, stride=ratio)]
            dim *= 2
        layers += [nn.ELU(), CausalConv1d(dim, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class SelfAttention(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, d)
        self.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # full causal: see top
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg.hidden_act!r}")
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, hidden) -> (B, T, hidden); positions 0..T-1."""
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """One VQ codebook, stored as the official EMA statistics (persistent buffers)."""

    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(cfg.codebook_size))
        self.register_buffer("embed_sum", torch.zeros(cfg.codebook_size, cfg.codebook_dim))

    def embed(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        self.codebook = Codebook(cfg)


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig, num_quantizers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantization(cfg) for _ in range(num_quantizers))
        self.input_proj: nn.Conv1d | None = None
        self.output_proj: nn.Conv1d | None = None  # decode side: held for a strict load
        vq_dim = cfg.vector_quantization_hidden_dimension
        if vq_dim != cfg.hidden_size:
            self.input_proj = nn.Conv1d(cfg.hidden_size, vq_dim, 1, bias=False)
            self.output_proj = nn.Conv1d(vq_dim, cfg.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """(B, hidden, T) -> codes (n, B, T) of the first `n` codebooks."""
        residual = self.input_proj(x) if self.input_proj is not None else x
        codes = []
        for vq in self.layers[:n]:
            embed = vq.codebook.embed()
            b, d, t = residual.shape
            flat = residual.permute(0, 2, 1).reshape(-1, d)
            idx = torch.cdist(flat[None].float(), embed[None].float(), p=2)[0].argmin(dim=-1)
            residual = residual - F.embedding(idx, embed).view(b, t, d).permute(0, 2, 1)
            codes.append(idx.view(b, t))
        return torch.stack(codes)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        self.num_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, self.num_semantic)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(
            cfg, cfg.num_quantizers - self.num_semantic)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """(B, hidden, T) -> (n, B, T): semantic codebooks, then acoustic ones (both RVQs
        start from the same latents)."""
        codes = self.semantic_residual_vector_quantizer.encode(x, self.num_semantic)
        if n > self.num_semantic:
            acoustic = self.acoustic_residual_vector_quantizer.encode(x, n - self.num_semantic)
            codes = torch.cat([codes, acoustic])
        return codes[:n]


class SpeechEncoder(nn.Module):
    """Mimi encoder of the 12 Hz speech tokenizer (see the module docstring)."""

    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        if not cfg.use_causal_conv:
            raise ValueError("only the causal Mimi encoder is supported")
        if not cfg.num_semantic_quantizers <= cfg.valid_num_quantizers <= cfg.num_quantizers:
            raise ValueError("valid_num_quantizers must lie in [semantic, num_quantizers]")
        self.cfg = cfg
        self.encoder = SeanetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        self.downsample = CausalConv1d(cfg.hidden_size, cfg.hidden_size, 4, stride=2,
                                       bias=False, pad_mode="replicate")
        self.quantizer = SplitResidualVectorQuantizer(cfg)

    def latents(self, wav: torch.Tensor) -> torch.Tensor:
        """(B, N) audio -> (B, hidden, T) pre-quantization latents at 12.5 Hz."""
        x = self.encoder(wav[:, None])
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        return self.downsample(x)

    @torch.inference_mode()
    def encode(self, wav24k: torch.Tensor) -> torch.Tensor:
        """(N,) float32 audio at 24 kHz -> (T, valid_num_quantizers) int64,
        T = ceil(N / frame_samples)."""
        if wav24k.dim() != 1 or wav24k.numel() == 0:
            raise ValueError(f"expected non-empty mono audio (N,), got {tuple(wav24k.shape)}")
        n = self.cfg.valid_num_quantizers
        # Plain float32 on CUDA too: cuDNN's default TF32 convs would move the latents by
        # ~1e-3 and flip codes of the later codebooks.
        with _precision(wav24k.device, tf32=False):
            codes = self.quantizer.encode(self.latents(wav24k[None]), n)  # (n, 1, T')
        frames = -(-wav24k.numel() // self.cfg.frame_samples)
        return codes[:, 0, :frames].transpose(0, 1).contiguous()


def reference_codes(model: WithSpeechEncoder, wav24k: np.ndarray) -> np.ndarray:
    """Reference codes (T, 16) int64 of mono 24 kHz audio, as the official
    `speech_tokenizer.encode` (eager, float32, on the encoder's device)."""
    enc = model.speech_encoder
    if enc is None:
        raise ValueError("reference codes need a Base checkpoint (no speech encoder loaded)")
    p = next(enc.parameters())
    if p.dtype != torch.float32:
        raise ValueError(f"the speech encoder runs in float32, got {p.dtype} (see prepare())")
    wav = torch.as_tensor(np.asarray(wav24k, dtype=np.float32), device=p.device)
    return enc.encode(wav).cpu().numpy().astype(np.int64)
