"""CUDA graphs of the decode step, one set per batch-size bucket, captured at start-up.

Eager, one decode step of the 0.6B model is thousands of small kernel launches (15
code-predictor steps x 5 layers, 28 talker layers, sampling, ~40 speech-decoder layers):
on an H100 the CPU that launches them, not the GPU, sets the pace. Each part of the step
(`Runner.step_talker`, `step_cp`, `step_decoder`: pure functions of tensors that read
and write the per-slot state in place) is captured as one graph with CUDA events between them,
so the step costs three launches and reports where its GPU time went. The speech decoder
runs on a stream of its own, beside the next step (`DecodeGraphs`).

Fixed shapes: a batch of n rows runs in the smallest bucket b >= n (1, 2, 4, ... max);
rows n..b-1 are padding that point at the scratch slot (`Runner.scratch_slot`). Each row
attends to its own cache positions only (the fused attention reads 0..position in place),
so outputs equal eager up to the order of float sums (gated by SNR in
tests/engine/test_graphs_gpu.py). The only inputs are the rows' slots and text ids, one
host-to-device copy (slots, text ids, talk flags); outputs go to pinned host buffers.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)
PARTS = ("talker_ms", "code_predictor_ms", "decoder_ms")  # the step's parts, in order
# Prompt-length buckets of the prefill graphs: a streaming prompt is ~10 rows, a voice
# instruction adds its tokens, an in-context clone its reference (12.5 rows a second:
# 30 s ~ 380 rows); longer prompts (offline text) run eagerly. Past 128 rows, graphs
# only for batches up to LONG_PROMPT_BATCH (their input buffers and capture time).
PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512)
LONG_PROMPT_BATCH = 8


def buckets_for(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def fit(buckets: list[int], n: int) -> int | None:
    """The smallest bucket that holds n (buckets ascending), None when none does."""
    return next((b for b in buckets if b >= n), None)


def capture_graphs(fns: list, pool, warmups: int = 1) -> list[torch.cuda.CUDAGraph]:
    """Warm fns up on a side stream (allocator, cuBLAS workspaces, Triton autotuning), then
    capture each as a graph in order, all in one memory pool (`pool`: None = a new one;
    the graphs' pool is `graphs[-1].pool()`). They must replay in that order, one at a time."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmups):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool), torch.no_grad():
            fn()
        pool = g.pool()
        graphs.append(g)
    return graphs


class _Bucket:
    def __init__(self, b: int, device: torch.device) -> None:
        self.b = b
        # slots, text ids, talk (1: the talker steps; 0: a row's first step)
        self.inputs = torch.zeros(3, b, dtype=torch.long, device=device)
        self.graphs: list[torch.cuda.CUDAGraph] = []  # talker, code predictor
        self.decoder: torch.cuda.CUDAGraph | None = None
        self.frame = self.decode = self.token = self.pcm = None


class _HostSlot:
    """Pinned host buffers and events of one step in flight (two alternate)."""

    def __init__(self, rows: int, groups: int, samples: int) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.long, pin_memory=True)
        self.codes = torch.zeros(rows, groups, dtype=torch.long, pin_memory=True)
        self.pcm = torch.zeros(rows, samples, dtype=torch.float32, pin_memory=True)
        # start, talker done, code predictor done, decoder start, decoder done
        self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        self.tokens_ready, self.audio_ready = torch.cuda.Event(), torch.cuda.Event()


class DecodeGraphs:
    """The decode step as graphs: talker then code predictor on the engine's stream, the
    speech decoder on a stream of its own. The decoder of frame N needs only frame N's
    codes, so it runs beside the talker and code predictor of the next step:
    the engine reads a step's tokens (talker), launches the next step, and only then
    reads this step's audio (`runner.Step`). The decoder copies its inputs (slots, codes)
    into buffers of its own first; the next step waits for that copy, not for the decoder,
    before it overwrites them. The host reads a step's tokens as soon as its talker is
    done. Decoder graphs have their own memory pool (they run
    concurrently with the others)."""

    def __init__(self, runner, buckets: list[int]) -> None:  # runner: Runner (no cycle)
        self.runner = runner
        self.buckets = sorted(buckets)
        self._by_size: dict[int, _Bucket] = {}
        self._pad_text = runner.cfg.tts_pad_token_id
        self.pool = None  # code predictor, talker (and prefill) graphs: one at a time
        self._decoder_pool = None
        self.stream = torch.cuda.Stream()  # the speech decoder's
        b, dev = self.buckets[-1], runner.device
        groups = runner.cfg.code_predictor.num_code_groups
        self._dec_slots = torch.full((b,), runner.scratch_slot, dtype=torch.long, device=dev)
        self._dec_frame = torch.zeros(b, groups, dtype=torch.long, device=dev)
        self._consumed = torch.cuda.Event()  # the decoder has copied its inputs
        samples = runner.cfg.speech_decoder.frame_samples
        self._host = [_HostSlot(b, groups, samples) for _ in range(2)]
        self._turn = 0

    def bucket(self, n: int) -> int | None:
        return fit(self.buckets, n)

    def _parts(self, bk: _Bucket) -> list:
        r = self.runner
        slots, text, talk = bk.inputs[0], bk.inputs[1], bk.inputs[2]

        def talker() -> None:
            bk.token = r.step_talker(slots, text, talk, r.max_seq_len)

        def cp() -> None:
            bk.frame, bk.decode = r.step_cp(slots)

        return [talker, cp]

    def _decoder(self, bk: _Bucket):
        def decoder() -> None:
            bk.pcm = self.runner.step_decoder(self._dec_slots[:bk.b], self._dec_frame[:bk.b])

        return decoder

    def capture(self) -> None:
        t0 = time.perf_counter()
        r = self.runner
        for b in reversed(self.buckets):  # largest first: its pool fits every smaller one
            bk = _Bucket(b, r.device)
            bk.inputs[0].fill_(r.scratch_slot)
            bk.inputs[1].fill_(self._pad_text)
            bk.inputs[2].fill_(1)
            bk.graphs = capture_graphs(self._parts(bk), self.pool, warmups=2)
            self.pool = bk.graphs[-1].pool()
            [bk.decoder] = capture_graphs([self._decoder(bk)], self._decoder_pool, warmups=2)
            self._decoder_pool = bk.decoder.pool()
            self._by_size[b] = bk
        torch.cuda.synchronize()
        log.info("captured decode graphs for batch %s in %.1f s (%.1f GB reserved)",
                 self.buckets, time.perf_counter() - t0, torch.cuda.memory_reserved() / 1e9)
        self.step_ms = self.time_buckets()
        log.info("step per bucket (ms, parts back to back): %s",
                 {b: round(ms, 2) for b, ms in self.step_ms.items()})

    def time_buckets(self, reps: int = 3) -> dict[int, float]:
        """Wall ms of one decode step per bucket: its graphs replayed back to back on
        scratch rows (the decoder not beside the next step, so an upper bound of the
        engine's frame period). Admission's capacity model starts from these."""
        out = {}
        for b in self.buckets:
            bk = self._by_size[b]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                for g in (*bk.graphs, bk.decoder):
                    g.replay()
            torch.cuda.synchronize()
            out[b] = (time.perf_counter() - t0) * 1e3 / reps
        self.runner.reset_scratch()
        return out

    def join(self) -> None:
        """Make the engine's stream wait for the decoder's (before eager decoder work)."""
        torch.cuda.current_stream().wait_stream(self.stream)

    def reset_decoder(self, slots: torch.Tensor, then: Callable[[], None]) -> None:
        """Zero the decoder state of `slots` on the decoder's stream, after the steps of
        the slots' previous owners that may still be decoding there; then `then()` there
        (eager decoder work: priming with reference codes)."""
        self.stream.wait_stream(torch.cuda.current_stream())  # slots was written here
        with torch.cuda.stream(self.stream):
            self.runner.decoder_slots.reset(slots)
            then()
        slots.record_stream(self.stream)

    def launch(self, slots: list[int], text_ids: list[int], talk: list[bool]
               ) -> tuple[Callable[[], list[int]], Callable[[], tuple]]:
        """Launch one step for these n rows -> (tokens(): codebook 0 of the frame each row
        made, audio(): (codes (n, 16), pcm (n, frame_samples), part times in ms)). Read
        tokens before launching the next step, audio before the one after."""
        n = len(slots)
        b = self.bucket(n)
        assert b is not None, f"no graph for batch {n}"
        bk = self._by_size[b]
        host, self._turn = self._host[self._turn], self._turn ^ 1
        host.audio_ready.synchronize()  # its last step was read (long done: two back)
        pad = b - n
        ids = torch.tensor([slots + [self.runner.scratch_slot] * pad,
                            text_ids + [self._pad_text] * pad,
                            talk + [True] * pad], dtype=torch.long)
        main = torch.cuda.current_stream()
        main.wait_event(self._consumed)  # the last step's decoder has its inputs
        bk.inputs.copy_(ids, non_blocking=True)
        marks = host.marks
        marks[0].record()
        talker, cp = bk.graphs
        if any(talk):
            talker.replay()
            token = bk.token
        else:  # first steps only: their prompts sampled the tokens (see Runner.launch)
            token = self.runner.state.last_token[bk.inputs[0]]
        marks[1].record()
        host.tokens[:n].copy_(token[:n], non_blocking=True)
        host.tokens_ready.record()
        cp.replay()
        marks[2].record()
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(marks[2])  # the code predictor's frame
            self._dec_slots[:b].copy_(bk.decode)
            self._dec_frame[:b].copy_(bk.frame)
            self._consumed.record()
            marks[3].record()
            bk.decoder.replay()
            marks[4].record()
            host.pcm[:n].copy_(bk.pcm[:n], non_blocking=True)
            host.codes[:n].copy_(self._dec_frame[:n], non_blocking=True)
            host.audio_ready.record()

        def tokens() -> list[int]:
            host.tokens_ready.synchronize()
            return host.tokens[:n].tolist()

        def audio() -> tuple:
            host.tokens_ready.synchronize()
            host.audio_ready.synchronize()
            spans = ((marks[0], marks[1]), (marks[1], marks[2]), (marks[3], marks[4]))
            timing = {name: a.elapsed_time(z) for name, (a, z) in zip(PARTS, spans,
                                                                      strict=True)}
            return host.codes[:n].numpy().copy(), host.pcm[:n].numpy().copy(), timing

        return tokens, audio


class PrefillGraphs:
    """`Runner.prefill_rows` as a CUDA graph per (batch, prompt length) bucket: a prefill
    costs one host-to-device copy and one replay instead of ~400 eager launches (the
    prompt embedding, 28 talker layers, sampling, the state writes), which sets TTFA and
    how long a mass join holds up the running streams.

    Input buffer per bucket, int64 (b, 2 + 2L): [slot, last row, L text ids, L codec ids];
    padding rows point at the scratch slot, padding ids are -1 (absent: zero rows). The
    extra vectors (x-vector, in-context rows) go into one shared (b, L, H) buffer (graphs
    replay one at a time)."""

    def __init__(self, runner, batches: list[int], lengths: list[int], pool) -> None:
        self.runner, self.batches, self.lengths, self.pool = runner, batches, lengths, pool
        self._buf: dict[tuple[int, int], torch.Tensor] = {}
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        rows = max((b * n for b, n in self.shapes()), default=0)
        self._extra = torch.zeros(rows, runner.cfg.talker.hidden_size, dtype=runner.dtype,
                                  device=runner.device)
        self.replays = 0

    def shapes(self) -> list[tuple[int, int]]:
        """The (batch, length) buckets captured, largest first."""
        return [(b, n) for b in reversed(self.batches) for n in reversed(self.lengths)
                if n <= 128 or b <= LONG_PROMPT_BATCH]

    def length_bucket(self, n: int) -> int | None:
        return fit(self.lengths, n)

    def extra(self, b: int, length: int) -> torch.Tensor:
        return self._extra[:b * length].view(b, length, -1)

    def fn(self, buf: torch.Tensor, length: int):
        """The captured work for one bucket's input buffer (eager when called directly)."""
        ids = buf[:, 2:].view(-1, 2, length).transpose(0, 1)
        extra = self.extra(buf.shape[0], length)
        # The Triton kernels index slots by row: give them a contiguous copy.
        return lambda: self.runner.prefill_rows(buf[:, 0].contiguous(), ids, buf[:, 1], extra)

    def capture(self) -> None:
        t0 = time.perf_counter()
        r = self.runner
        for b, length in self.shapes():
            buf = torch.full((b, 2 + 2 * length), -1, dtype=torch.long, device=r.device)
            buf[:, 0], buf[:, 1] = r.scratch_slot, 0
            [g] = capture_graphs([self.fn(buf, length)], self.pool)
            self.pool = g.pool()
            self._buf[b, length], self._graphs[b, length] = buf, g
        torch.cuda.synchronize()
        log.info("captured prefill graphs for batch %s x prompt rows %s in %.1f s",
                 self.batches, self.lengths, time.perf_counter() - t0)

    def inputs(self, b: int, slots: list[int], rows: list, last: list[int]) -> torch.Tensor:
        """A bucket's input buffer (host) for these `PromptRows`, padded to b rows."""
        length = len(rows[0].text)
        host = torch.full((b, 2 + 2 * length), -1, dtype=torch.long)
        host[:, 0], host[:, 1] = self.runner.scratch_slot, 0
        n = len(slots)
        host[:n, 0], host[:n, 1] = torch.tensor(slots), torch.tensor(last)
        host[:n, 2:] = torch.tensor([r.text + r.codec for r in rows])
        return host

    def run(self, slots: list[int], rows: list, last: list[int]) -> bool:
        """Prefill these `PromptRows` (padded to one bucket length); False when no graph
        fits."""
        length = len(rows[0].text)
        b = fit(self.batches, len(slots))
        if b is None or (b, length) not in self._graphs:
            return False
        self._buf[b, length].copy_(self.inputs(b, slots, rows, last))
        self.runner.extra_rows(rows, length, out=self.extra(b, length))
        self._graphs[b, length].replay()
        self.replays += 1
        return True
