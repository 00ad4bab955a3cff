"""The talker: a Qwen3 decoder over the dual track (text embedding + codec embedding).

Each decode step consumes one row per session: the sum of the 16 codec embeddings of the
frame just completed plus the projected embedding of the next text-track token, and
emits the logits of codebook 0 of the next frame. The module knows nothing about
sessions, sampling or text: `runner.py` builds its inputs and owns its caches.

Attribute names mirror the official `Qwen3TTSTalkerForConditionalGeneration` (minus the
`talker.` prefix) so the checkpoint maps with a prefix strip (see checkpoint.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TalkerConfig
from .code_predictor import CodePredictor
from .layers import (
    DecoderLayer,
    KVCache,
    RMSNorm,
    head,
    rope_cos_sin,
    rope_inv_freq,
    run_layers,
)


class TextProjection(nn.Module):
    """Official `text_projection` (ResizeMLP): text_hidden -> text_hidden -> talker hidden."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(nn.Module):
    """`talker.model`: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig, code_predictor: CodePredictor) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = code_predictor
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)
        self.caches: nn.ModuleList | None = None

    def setup_caches(self, slots: int, max_len: int, dtype: torch.dtype,
                     device: torch.device | str) -> None:
        self.caches = nn.ModuleList(
            KVCache(slots, self.cfg.num_key_value_heads, max_len, self.cfg.head_dim, dtype,
                    device) for _ in self.model.layers)
        self.max_len = max_len

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text-track rows: ids (B, T) -> (B, T, hidden)."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def forward(self, x: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                kv_len: int) -> torch.Tensor:
        """x (B, T, hidden) at positions (B, T) -> hidden states (B, T, H); `logits` of the
        rows that need them."""
        assert self.caches is not None, "call setup_caches() first"
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        return run_layers(self.model.layers, self.caches, self.model.norm, x, cos, sin,
                          slots, positions, kv_len)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Codebook-0 logits (..., vocab) of hidden states (..., H)."""
        return head(self.codec_head, hidden, self.model.layers[0].fused)
