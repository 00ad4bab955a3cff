"""Continuous batching for an HF decoder: one forward a step for every request in flight.

One thread owns the model. Each loop: drop cancelled requests, prefill the new ones (one
forward for all of them, each into a free slot of the `SlotCache`), then one decode step
over every slot in use, each row at its own position. Requests join and leave between
steps. An omni thinker (omni.py) is driven the same way: its prefill encodes the new rows'
audio in the same forward, and each decode row's rotary position adds its rope delta.

On CUDA the decode step replays a CUDA graph captured at start for its (rows, kv_len)
bucket: rows = slots [0, R) with R the next power of two above the highest slot in use
(free slots in it compute on a dummy token, their keys never read), kv_len the next
bucket above the longest row. Eager, an HF decoder of 1.7B spends ~20-35 ms of CPU a step
on the H100 whatever the batch; the replay costs what the GPU does. On CPU it runs eager.
Paced (`pace_tokens_per_s`), steps wait once every request has its first tokens, leaving
the GPU to the TTS; a new request ends the wait.

Tokens go out through each request's `emit` (thread-safe, called from this thread): a
list of new ids, an exception, or `END` once the request is over (end of sequence,
max_new, cancelled or failed). `steps` counts the forwards a request took part in, so
tests can see a cancel stop the work rather than assume it.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from voice_llm.backends.omni import AudioPrompt, OmniThinker
from voice_llm.backends.sampling import new_generator, pick
from voice_llm.backends.slot_cache import SlotCache, causal_mask
from voice_llm.chat import SamplingOptions
from voice_llm.errors import is_device_fault

log = logging.getLogger(__name__)
END = object()
_KV_MIN = 128  # the smallest kv_len bucket


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_new: int
    options: SamplingOptions
    emit: Callable[[Any], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    steps: int = 0  # forwards taken (read by tests and abort logging)
    slot: int = -1
    position: int = 0  # where `last` is written by the next step
    last: int = 0
    generated: int = 0
    generator: torch.Generator | None = None
    # A tools.Constraint (a grammar the reply must follow: a forced tool call) or None.
    constraint: Any = None
    # An omni thinker's request with audio: its features and M-RoPE positions (omni.py).
    audio: AudioPrompt | None = None


def buckets(top: int, start: int) -> list[int]:
    """Powers of two from `start` below `top`, then `top` itself."""
    out, b = [], start
    while b < top:
        out.append(b)
        b *= 2
    return [*out, top]


class _Graph:
    """One captured decode step for `rows` rows reading `kv_len` keys."""

    def __init__(self, rows: int, kv_len: int, device: torch.device) -> None:
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        # Each row's rope delta (omni thinkers only; zeros for a text row).
        self.deltas = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.row_index = torch.arange(rows, device=device)[:, None]
        self.kv_len = kv_len
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class Batcher:
    def __init__(self, model: Any, slots: int, max_len: int, eos: set[int],
                 allowed: torch.Tensor | None, graphs: bool, pace_tokens_per_s: float = 0.0,
                 pace_after_tokens: int = 0) -> None:
        self.model = model
        # An omni thinker takes audio in its prefill and M-RoPE deltas in its decode steps.
        self._omni = model if isinstance(model, OmniThinker) else None
        self.device = model.device
        self.cache = SlotCache(model.config, slots, max_len, model.dtype, self.device)
        self._layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if self._layer_types != {"full_attention"}:
            raise ValueError(f"the transformers backend batches full attention only, not "
                             f"{sorted(self._layer_types)}: use the vLLM backend")
        # transformers 5.24 renamed the forward's `past_key_values` to `cache`
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._eos, self._allowed = eos, allowed
        self._rows: list[Request | None] = [None] * slots
        self._pending: deque[Request] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._pace_interval = 1.0 / pace_tokens_per_s if pace_tokens_per_s > 0 else 0.0
        self._pace_after = pace_after_tokens
        self._last_step = 0.0
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._row_buckets = buckets(slots, 1)
        self._kv_buckets = buckets(max_len, min(_KV_MIN, max_len))
        self.fault: BaseException | None = None
        self.on_fault: Callable[[BaseException], None] | None = None
        if graphs:
            self._capture()
        self._thread = threading.Thread(target=self._loop, name="hf-batcher", daemon=True)
        self._thread.start()

    def submit(self, req: Request) -> None:
        req.generator = new_generator(req.options, self.device)
        with self._cond:
            if self._closed or self.fault is not None:
                raise RuntimeError("the batcher is closed")
            self._pending.append(req)
            self._cond.notify()

    def wake(self) -> None:
        """Makes the loop look at cancel flags now (it may be waiting for work)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # The loop thread from here on.

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._closed or self._pending or any(self._rows)
                               or self._cancel_pending()):
                        self._cond.wait()
                    if self._closed:
                        break
                    if pause := self._pace_delay():
                        self._cond.wait_for(lambda: self._pending or self._closed, pause)
                try:
                    self._step()
                except BaseException as e:  # a bug or a device fault: fail who was in it
                    log.exception("batched step failed")
                    if is_device_fault(e):
                        self.fault = e  # the CUDA context is gone: the server exits
                        if self.on_fault is not None:
                            self.on_fault(e)
                    for req in [r for r in self._rows if r is not None]:
                        self._finish(req, e)
                    if self.fault is not None:
                        break
        with self._cond:
            left = [r for r in self._rows if r is not None] + list(self._pending)
            self._pending.clear()
        for req in left:
            self._finish(req, self.fault)

    def _pace_delay(self) -> float:
        """Seconds to wait before the next step: > 0 only while pacing and every request
        in the batch is past its first `pace_after` tokens."""
        active = [r for r in self._rows if r is not None]
        if not self._pace_interval or not active or any(
                r.generated < self._pace_after for r in active):
            return 0.0
        return max(0.0, self._last_step + self._pace_interval - time.monotonic())

    def _cancel_pending(self) -> bool:
        return any(r.cancel.is_set() for r in self._pending)

    def _step(self) -> None:
        for req in [r for r in self._rows if r is not None and r.cancel.is_set()]:
            self._finish(req)
        new = []
        while None in self._rows:
            with self._cond:
                if not self._pending:
                    break
                req = self._pending.popleft()
            if req.cancel.is_set():
                self._finish(req)
                continue
            req.slot = self._rows.index(None)
            self._rows[req.slot] = req
            new.append(req)
        if new:
            try:
                self._prefill(new)
            except BaseException as e:
                if is_device_fault(e):
                    raise
                log.exception("prefill failed")
                for req in new:
                    self._finish(req, e)
        active = [r for r in self._rows if r is not None]
        if active:
            self._last_step = time.monotonic()
            self._decode(active)

    def _prefill(self, reqs: list[Request]) -> None:
        """The new requests' prompts in one forward, right-padded to the longest (a pad's
        keys land past its row's end: masked, then overwritten by its decode steps)."""
        lengths = [len(r.prompt) for r in reqs]
        longest, dev = max(lengths), self.device
        ids = torch.tensor([r.prompt + [0] * (longest - len(r.prompt)) for r in reqs],
                           device=dev)
        positions = torch.arange(longest, device=dev)[None].expand(len(reqs), -1)
        self.cache.bind(torch.tensor([[r.slot] for r in reqs], device=dev), positions,
                        longest)
        mask = causal_mask(positions, longest)
        # Logits at every row's last position, for every row: (R, R, V); row i takes its own.
        last = torch.tensor([n - 1 for n in lengths], device=dev)
        inputs: dict[str, torch.Tensor] = {"input_ids": ids, "position_ids": positions}
        if self._omni is not None:
            inputs = self._omni_inputs(reqs, ids, positions)
        out = self.model(**inputs, attention_mask={t: mask for t in self._layer_types},
                         use_cache=True, logits_to_keep=last, **{self._cache_arg: self.cache})
        diagonal = torch.arange(len(reqs), device=dev)
        for req, n in zip(reqs, lengths, strict=True):
            req.position = n
        self._advance(reqs, out.logits[diagonal, diagonal])

    def _omni_inputs(self, reqs: list[Request], ids: torch.Tensor,
                     positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """An omni prefill's embeddings (audio encoded into its placeholders) and M-RoPE
        positions (3, R, T): a row with audio takes the model's own, a text row (and every
        row's padding, masked) its token index on all three axes."""
        rope = positions[None].repeat(3, 1, 1)
        for i, r in enumerate(reqs):
            if r.audio is not None:
                rope[:, i, : len(r.prompt)] = r.audio.positions.to(self.device)
        embeds = self._omni.embed(ids, [r.audio for r in reqs if r.audio is not None])
        return {"inputs_embeds": embeds, "position_ids": rope}

    def _decode(self, active: list[Request]) -> None:
        rows = next(b for b in self._row_buckets if b > max(r.slot for r in active))
        kv_len = next(b for b in self._kv_buckets if b > max(r.position for r in active))
        ids = [0] * rows
        positions = [0] * rows
        deltas = [0] * rows
        for r in active:
            ids[r.slot], positions[r.slot] = r.last, r.position
            if r.audio is not None:
                deltas[r.slot] = r.audio.rope_delta
        graph = self._graphs.get((rows, kv_len))
        if graph is not None:
            graph.ids.copy_(torch.tensor(ids)[:, None], non_blocking=True)
            graph.positions.copy_(torch.tensor(positions)[:, None], non_blocking=True)
            if self._omni is not None:
                graph.deltas.copy_(torch.tensor(deltas)[:, None], non_blocking=True)
            graph.graph.replay()
            logits = graph.logits
        else:
            logits = self._decode_forward(
                torch.tensor(ids, device=self.device)[:, None],
                torch.tensor(positions, device=self.device)[:, None],
                torch.arange(rows, device=self.device)[:, None], kv_len,
                torch.tensor(deltas, device=self.device)[:, None] if self._omni is not None
                else None)
        for r in active:
            r.position += 1  # the token this step makes goes after the one it read
        rows_used = torch.tensor([r.slot for r in active], device=self.device)
        self._advance(active, logits[rows_used])

    def _decode_forward(self, ids: torch.Tensor, positions: torch.Tensor,
                        row_index: torch.Tensor, kv_len: int,
                        deltas: torch.Tensor | None) -> torch.Tensor:
        """positions (R, 1) index the KV cache; the rotary position is position + the row's
        rope delta (an omni row after audio), on a text model the position itself."""
        self.cache.bind(row_index, positions, kv_len, rows=slice(0, ids.shape[0]))
        mask = causal_mask(positions, kv_len)
        rope = positions + deltas if self._omni is not None and deltas is not None \
            else positions
        out = self.model(input_ids=ids, position_ids=rope,
                         attention_mask={t: mask for t in self._layer_types},
                         use_cache=True, **{self._cache_arg: self.cache})
        return out.logits[:, -1]

    def _advance(self, reqs: list[Request], logits: torch.Tensor) -> None:
        allowed = self._allowed
        constrained = [i for i, r in enumerate(reqs) if r.constraint is not None]
        if constrained:
            # A grammar row takes the grammar's mask instead of `allowed` (which bans the
            # newlines a tool call's tags need under random weights): one mask a row.
            rows = torch.ones(len(reqs), logits.shape[-1], dtype=torch.bool,
                              device=logits.device)
            if allowed is not None:
                rows[:] = allowed
            for i in constrained:
                rows[i] = reqs[i].constraint.allowed(logits.shape[-1], logits.device)
            allowed = rows
        tokens = pick(logits, [r.options for r in reqs], [r.generator for r in reqs], allowed)
        for req, token in zip(reqs, tokens, strict=True):
            req.steps += 1
            if isinstance(token, BaseException):
                log.error("request failed: %s", token)
                self._finish(req, token)
                continue
            if req.constraint is not None and not req.constraint.accept(token):
                self._finish(req, RuntimeError(f"token {token} broke the reply's grammar"))
                continue
            req.generated += 1
            req.last = token
            req.emit([token])
            if token in self._eos or req.generated >= req.max_new:
                self._finish(req)

    def _finish(self, req: Request, error: BaseException | None = None) -> None:
        if req.slot >= 0 and self._rows[req.slot] is req:
            self._rows[req.slot] = None
        if error is not None:
            req.emit(error)
        req.emit(END)
        req.done.set()

    def _capture(self) -> None:
        """A CUDA graph per (rows, kv_len) bucket, before any request: capture writes
        dummy keys at position 0 of every slot, harmless only while all slots are free."""
        start, pool = time.perf_counter(), torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        with torch.inference_mode():
            for rows in self._row_buckets:
                for kv_len in self._kv_buckets:
                    g = _Graph(rows, kv_len, self.device)
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(2):
                            self._decode_forward(g.ids, g.positions, g.row_index, kv_len,
                                                 g.deltas)
                    torch.cuda.current_stream().wait_stream(side)
                    g.graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g.graph, pool=pool):
                        g.logits = self._decode_forward(g.ids, g.positions, g.row_index,
                                                        kv_len, g.deltas)
                    self._graphs[rows, kv_len] = g
        torch.cuda.synchronize()
        log.info("captured %d decode graphs (rows %s x kv_len %s) in %.1f s", len(self._graphs),
                 self._row_buckets, self._kv_buckets, time.perf_counter() - start)
