"""CUDA graphs of the decode step, one per batch-size bucket, captured at start-up.

Eager, one decode step of the 0.6B model is ~6,500 kernel launches (15 code-predictor
steps x 5 layers + 28 talker layers + sampling): on an H100 the CPU that launches them,
not the GPU, sets the pace. A graph replays the whole step (`predict_frame` +
`talker_step`, both pure functions of tensors) with one launch.

Fixed shapes: the batch is padded up to the next bucket (1, 2, 4, ... max) with rows that
write only to a scratch KV slot (`Runner.scratch_slot`), and attention always spans the
whole static cache (`kv_len = max_seq_len`), the positions past each row's own masked
out. Masked keys add exact zeros, so outputs equal eager up to the order of float sums
(gated by SNR in tests/engine/test_graphs_gpu.py). Inputs are copied into static buffers
before `replay()`; outputs are the graph's own buffers, read before the next replay.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields

import torch

from .sampling import SamplingTensors

log = logging.getLogger(__name__)


def buckets_for(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


class DecodeGraphs:
    def __init__(self, runner, buckets: list[int]) -> None:  # runner: Runner (no cycle)
        self.runner = runner
        self.buckets = sorted(buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static: dict[int, dict] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        self.pad: dict[int, dict] = {}  # per bucket: the inputs of a padding row

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def _inputs(self, b: int) -> dict:
        r, cfg = self.runner, self.runner.cfg
        dev, h = r.device, cfg.talker.hidden_size
        v, v_cp = cfg.talker.vocab_size, cfg.code_predictor.vocab_size
        n_cp = cfg.code_predictor.num_code_groups - 1

        def sampling(vocab: int) -> SamplingTensors:
            return SamplingTensors(
                do_sample=torch.zeros(b, dtype=torch.bool, device=dev),
                temperature=torch.ones(b, dtype=torch.float32, device=dev),
                top_k=torch.full((b,), vocab, dtype=torch.long, device=dev),
                top_p=torch.ones(b, dtype=torch.float32, device=dev))

        return {
            "last_token": torch.zeros(b, dtype=torch.long, device=dev),
            "past_hidden": torch.zeros(b, h, dtype=r.dtype, device=dev),
            "cp_p": sampling(v_cp),
            "cp_noise": torch.ones(b, n_cp, v_cp, device=dev),
            "text_ids": torch.full((b,), cfg.tts_pad_token_id, dtype=torch.long, device=dev),
            "slots": torch.full((b,), r.scratch_slot, dtype=torch.long, device=dev),
            "positions": torch.zeros(b, dtype=torch.long, device=dev),
            "seen": torch.zeros(b, v, dtype=torch.bool, device=dev),
            "n_generated": torch.zeros(b, dtype=torch.long, device=dev),
            "penalty": torch.ones(b, dtype=torch.float32, device=dev),
            "talker_p": sampling(v),
            "talker_noise": torch.ones(b, v, device=dev),
        }

    def capture(self) -> None:
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        for b in reversed(self.buckets):  # largest first: the pool fits every smaller one
            st = self._inputs(b)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: cuBLAS handles, workspaces, autotuning
                    self.runner.step_tensors(st, self.runner.max_seq_len)
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = self.runner.step_tensors(st, self.runner.max_seq_len)
            self.pool = g.pool()
            self.graphs[b], self.static[b], self.outputs[b] = g, st, out
            self.pad[b] = self._inputs(b)
        torch.cuda.synchronize()
        log.info("captured decode graphs for batch %s in %.1f s", self.buckets,
                 time.perf_counter() - t0)

    def run(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """inputs: the eager step's tensors for n rows -> outputs for those n rows."""
        n = inputs["slots"].shape[0]
        b = self.bucket(n)
        assert b is not None and b in self.graphs, f"no graph for batch {n}"
        st = self.static[b]
        fresh = self.pad[b] if n < b else None
        for key, val in inputs.items():
            dst = st[key]
            if isinstance(val, SamplingTensors):
                for f in fields(SamplingTensors):
                    d, s = getattr(dst, f.name), getattr(val, f.name)
                    d[:n].copy_(s)
                    if fresh is not None:
                        d[n:].copy_(getattr(fresh[key], f.name)[n:])
            else:
                dst[:n].copy_(val)
                if fresh is not None:
                    dst[n:].copy_(fresh[key][n:])
        self.graphs[b].replay()
        frame, token, hidden = self.outputs[b]
        return frame[:n].clone(), token[:n].clone(), hidden[:n].clone()
