"""The code predictor: per frame, codebooks 1..15 from the talker's hidden state.

Per frame it runs a fresh 2-token prefill ([talker hidden of the previous step,
embedding of codebook 0]) and then 14 one-token steps, each feeding back the embedding of
the code it just chose through its own embedding table and reading its own LM head
(`lm_head[i]` predicts codebook i+1). The cache is per frame, so it is indexed by batch
row, not by session slot: rows 0..B-1 of a (max_batch, kv_heads, 16, head_dim) buffer.

Attribute names mirror `talker.code_predictor.*` of the official checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import CodePredictorConfig
from .layers import (
    DecoderLayer,
    KVCache,
    RMSNorm,
    head,
    rope_cos_sin,
    rope_inv_freq,
    run_layers,
)


class CodePredictorBackbone(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Embeddings live at the talker width; the projection maps them down (1.7B).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorBackbone(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            for _ in range(cfg.num_code_groups - 1))
        self.small_to_mtp_projection = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
            if talker_hidden != cfg.hidden_size else nn.Identity())
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)
        self.caches: nn.ModuleList | None = None

    @property
    def frame_len(self) -> int:
        return self.cfg.num_code_groups  # 2 prefill rows + 14 steps

    def setup_caches(self, max_batch: int, dtype: torch.dtype,
                     device: torch.device | str) -> None:
        self.caches = nn.ModuleList(
            KVCache(max_batch, self.cfg.num_key_value_heads, self.frame_len,
                    self.cfg.head_dim, dtype, device) for _ in self.model.layers)
        # Every row of a frame is at the same positions 0..15: one RoPE table, sliced per
        # step (views, no kernels).
        self._rows = torch.arange(max_batch, device=device)
        self._positions = torch.arange(self.frame_len, device=device)[None]
        self._cos, self._sin = rope_cos_sin(self.inv_freq.to(device), self._positions, dtype)

    def forward(self, x: torch.Tensor, start: int, group: int) -> torch.Tensor:
        """x (B, T, talker_hidden) at frame positions start..start+T-1 -> logits of
        lm_head[group] (B, vocab) at the last row. Rows 0..B-1 of the cache are used."""
        assert self.caches is not None, "call setup_caches() first"
        x = self.small_to_mtp_projection(x)
        b, t = x.shape[:2]
        at = slice(start, start + t)
        hidden = run_layers(self.model.layers, self.caches, self.model.norm, x,
                            self._cos[:, at].expand(b, -1, -1),
                            self._sin[:, at].expand(b, -1, -1), self._rows[:b],
                            self._positions[:, at].expand(b, -1), self.frame_len)
        return head(self.lm_head[group], hidden[:, -1], self.model.layers[0].fused)
