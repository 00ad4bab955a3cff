"""The three hooks that make HF `generate` streamable, cancellable and seedable.

Imported inside the generation thread only (they pull in torch and transformers).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from voice_llm.chat import SamplingOptions


class QueueStreamer(BaseStreamer):
    """Hands each step's new token ids to an asyncio queue (thread -> event loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> None:
        self._loop = loop
        self._queue = queue
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first puts the whole prompt
            self._prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, ids)

    def end(self) -> None:
        pass  # the worker signals the end itself, after errors too


class CancelOnEvent(StoppingCriteria):
    """Ends generate() after the step in progress once the request's cancel event is set."""

    def __init__(self, run: Any) -> None:
        self._run = run

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
        self._run.steps += 1
        stop = self._run.cancel.is_set()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class SeededSampler(LogitsProcessor):
    """Temperature + top-p sampling with the request's own generator.

    Returns logits that are -inf everywhere but the sampled token, so generate()'s
    greedy pick takes exactly that token.
    """

    def __init__(self, options: SamplingOptions, device: torch.device) -> None:
        self._temperature = options.temperature
        self._top_p = options.top_p
        self._gen = torch.Generator(device=device)
        if options.seed is not None:
            self._gen.manual_seed(options.seed % 2**63)
        else:
            self._gen.seed()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self._temperature, dim=-1)  # (B, V)
        if self._top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest set whose mass reaches top_p (the first token always stays).
            drop = sorted_p.cumsum(dim=-1) - sorted_p > self._top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        picked = torch.multinomial(probs, 1, generator=self._gen)  # (B, 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, picked, 0.0)


class AllowedIds(LogitsProcessor):
    """Only the ids `allowed` marks (a bool tensor over the LM head) can win."""

    def __init__(self, allowed: torch.Tensor) -> None:
        self._banned = ~allowed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(self._banned, float("-inf"))
