"""A static KV cache an HF decoder writes through its cache argument, one slot per request.

Each layer holds k, v buffers (slots, kv_heads, max_len, head_dim). A forward is bound to
its rows' slots and each row's positions; HF's attention calls `update(k, v, layer_idx,
...)`, which writes the new keys at those positions in place and returns the rows' first
`kv_len` positions (a view when the slots are consecutive, as in a decode step). Shapes
depend only on (rows, kv_len), never on the data, so a decode step over a fixed (rows,
kv_len) can be captured in a CUDA graph once and replayed.

Keys a row has not written (a freed slot's stale keys, positions past its own) are never
read: the caller's mask admits key j to a query at position p only when j <= p.
"""

from __future__ import annotations

from typing import Any

import torch


class SlotCache:
    def __init__(self, config: Any, slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        shape = (slots, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device)
                  for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device)
                  for _ in range(config.num_hidden_layers)]
        self.slots, self.max_len = slots, max_len
        self._rows: slice | None = None
        self._row_index = torch.zeros(1, 1, dtype=torch.long, device=device)
        self._positions = torch.zeros(1, 1, dtype=torch.long, device=device)
        self._kv_len = 1

    def bind(self, row_index: torch.Tensor, positions: torch.Tensor, kv_len: int,
             rows: slice | None = None) -> None:
        """The next forward's rows are the slots in row_index, an (R, 1) tensor; positions
        (R, T) are where each row's T new keys go. `rows`, the same slots as a slice when
        they are consecutive, makes the read a view (a decode step); without it the rows
        are gathered (a prefill into scattered free slots)."""
        self._row_index, self._positions, self._kv_len = row_index, positions, kv_len
        self._rows = rows

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int,
               *_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (R, kv_heads, T, D) -> the rows' cache (R, kv_heads, kv_len, D)."""
        kb, vb = self.k[layer_idx], self.v[layer_idx]
        index = (self._row_index, slice(None), self._positions)
        kb[index] = k.transpose(1, 2)  # index_put takes (R, T, kv_heads, D)
        vb[index] = v.transpose(1, 2)
        rows = self._rows if self._rows is not None else self._row_index[:, 0]
        return kb[rows, :, : self._kv_len], vb[rows, :, : self._kv_len]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len  # the model asks only when no position_ids are given


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """positions (R, T) -> (R, 1, T, kv_len) bool: key j visible to a query at p iff j <= p."""
    keys = torch.arange(kv_len, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)
