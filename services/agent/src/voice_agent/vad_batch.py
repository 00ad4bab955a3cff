"""Silero VAD for all the conversations of a process: one ONNX call a hop, not one a stream.

livekit-plugins-silero's stream runs the model itself, one 32 ms window (512 samples at
16 kHz, with the 64 before it as context) at a time through the loop's default executor:
N conversations (two streams each: the session's and the STT's) make 2N small
`session.run`s and 2N thread hand-offs a hop. Silero v5's ONNX takes a batch (`input`
(B, 576), `state` (2, B, 128)) whose rows do not mix: batched probabilities equal those
of one at a time (bit for bit on this CPU), and a row costs ~68 us in a batch of 16-64
against ~163 us alone (2-core EPYC, one intra-op thread).

`BatchedVAD` is the plugin's VAD; its streams run the plugin's own stream code (options,
thresholds, smoothing, events) unchanged, except that the one inference call a window
goes to the process's batch instead of a thread. Each stream keeps its model state (a
`_Row`) and its own copy of the options (the plugin's streams share their VAD's options
object, so one stream's `update_options` tuned them all).

Batching (per event loop, `_Hop`): a window waits for the other streams' at most
`MAX_WAIT_S`. The batch runs as soon as every stream that sent a window in the last two
hops has one waiting, or a stream that is behind (audio already queued behind its
window: a backlog, a clip pushed at once) sends one, or `MAX_WAIT_S` after its first
window. One batch runs at a time on one worker thread (one intra-op thread); windows
sent meanwhile gather for the next. A failed run fails every window of its batch: each
stream ends with the error, as the plugin's ends with its own.

Knows nothing of turns, doors or settings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from livekit.agents.utils import aio
from livekit.plugins import silero
from livekit.plugins.silero import onnx_model

# Streams' windows fall due at their own phases in the 32 ms hop, so a wait of W gathers
# about N * W / 32 of them: 8 ms (a quarter hop) made batches of 16 of the 32 streams of 16
# conversations, where a row costs its least (bench/vad_cost.py; 4 ms: 10, +7 % CPU), and
# delays by <= 8 ms a decision that waits out 200 ms of silence (AGENT_VAD_SILENCE_MS).
MAX_WAIT_S = 0.008
STALE_HOPS = 2  # a stream silent this many hops is not waited for (paused, closed)


class _Row(onnx_model.OnnxModel):
    """One stream's place in the batch: the plugin model's context and RNN state, which the
    batch reads and advances (only while the stream awaits its window)."""


@dataclass
class _Window:
    row: _Row
    pcm: np.ndarray  # (512,) float32, the plugin's scaled window
    future: asyncio.Future[float]


class WindowBatch:
    """The model for a process: one ONNX session, one worker thread, a `_Hop` per loop."""

    def __init__(self, session: Any, sample_rate: int, max_wait_s: float = MAX_WAIT_S) -> None:
        self.session = session
        self.sample_rate = sample_rate
        self.max_wait_s = max_wait_s
        self._sr = np.array(sample_rate, dtype=np.int64)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vad-batch")
        self._hops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hop] = (
            weakref.WeakKeyDictionary())

    def hop(self) -> _Hop:
        """The running loop's gathering of windows."""
        loop = asyncio.get_running_loop()
        if loop not in self._hops:
            self._hops[loop] = _Hop(self, loop)
        return self._hops[loop]

    def row(self) -> _Row:
        return _Row(onnx_session=self.session, sample_rate=self.sample_rate)

    def run(self, windows: list[_Window]) -> np.ndarray:
        """One `session.run` for the windows (worker thread) -> (B,) probabilities; each
        row's state advanced as the plugin's model advances its own."""
        ctx = windows[0].row.context_size
        x = np.empty((len(windows), ctx + len(windows[0].pcm)), np.float32)  # (B, 576)
        state = np.empty((2, len(windows), 128), np.float32)  # (2, B, 128)
        for i, w in enumerate(windows):
            x[i, :ctx] = w.row._context[0]
            x[i, ctx:] = w.pcm
            state[:, i] = w.row._rnn_state[:, 0]
        out, state_n = self.session.run(None, {"input": x, "state": state, "sr": self._sr})
        for i, w in enumerate(windows):
            w.row._rnn_state[:, 0] = state_n[:, i]
            w.row._context[0] = x[i, -ctx:]
        return out[:, 0]  # (B,)


class _Hop:
    """The windows of one event loop's streams, gathered into batches (see the module)."""

    def __init__(self, batch: WindowBatch, loop: asyncio.AbstractEventLoop) -> None:
        self.batch, self.loop = batch, loop
        self.stale_s = STALE_HOPS * 512 / batch.sample_rate
        self.members: dict[_Row, float] = {}  # row -> loop time of its last window
        self.waiting: list[_Window] = []
        self.timer: asyncio.TimerHandle | None = None
        self.due = False  # run the waiting windows as soon as no batch runs
        self.running = False

    def submit(self, row: _Row, pcm: np.ndarray, behind: bool) -> asyncio.Future[float]:
        now = self.loop.time()
        if not self.waiting:
            self.timer = self.loop.call_at(now + self.batch.max_wait_s, self._ready)
        future = self.loop.create_future()
        self.waiting.append(_Window(row, pcm.copy(), future))
        self.members[row] = now
        if behind or len(self.waiting) >= len(self.members):
            self._ready()
        return future

    def leave(self, row: _Row) -> None:
        self.members.pop(row, None)
        if self.waiting and len(self.waiting) >= len(self.members):
            self._ready()

    def _ready(self) -> None:
        if not self.due:
            self.due = True
            # after the callbacks already queued: streams woken by the last batch send
            # their next windows first, and join this one
            self.loop.call_soon(self._launch)

    def _launch(self) -> None:
        if self.running or not self.due:
            return
        if self.timer is not None:
            self.timer.cancel()
        windows, self.waiting, self.timer, self.due = self.waiting, [], None, False
        if not windows:
            return
        self.running = True
        stale = self.loop.time() - self.stale_s
        self.members = {r: t for r, t in self.members.items() if t >= stale}
        done = self.loop.run_in_executor(self.batch._worker, self.batch.run, windows)
        done.add_done_callback(lambda f: self._finish(windows, f))

    def _finish(self, windows: list[_Window], done: asyncio.Future[np.ndarray]) -> None:
        self.running = False
        error = done.exception()
        for i, w in enumerate(windows):
            if w.future.done():  # its stream closed meanwhile
                continue
            if error is not None:
                w.future.set_exception(error)
            else:
                w.future.set_result(float(done.result()[i]))
        if self.due:
            self.due = False
            self._ready()


class _HopInference:
    """Stands in for the plugin stream's `_loop`, whose one use in its `_main_task` is
    `await self._loop.run_in_executor(None, self._model, window)`, once a window."""

    def __init__(self, hop: _Hop, row: _Row, input_ch: aio.Chan[Any]) -> None:
        self._hop, self._row, self._input_ch = hop, row, input_ch

    def run_in_executor(self, executor: None, model: _Row,
                        window: np.ndarray) -> asyncio.Future[float]:
        assert executor is None and model is self._row, "silero's stream changed: see module"
        return self._hop.submit(model, window, behind=not self._input_ch.empty())


class BatchedVADStream(silero.VADStream):
    """The plugin's stream, its windows run in the process's batch."""

    def __init__(self, vad: BatchedVAD, opts: Any, batch: WindowBatch) -> None:
        row = batch.row()
        super().__init__(vad, opts, row)
        hop = batch.hop()
        self._loop = _HopInference(hop, row, self._input_ch)  # type: ignore[assignment]
        self._task.add_done_callback(lambda _: hop.leave(row))


class BatchedVAD(silero.VAD):
    """Silero's VAD (`silero.VAD.load` builds it) whose streams share one batch."""

    def __init__(self, *, session: Any, opts: Any) -> None:
        super().__init__(session=session, opts=opts)
        self.batch = WindowBatch(session, opts.sample_rate)

    def stream(self) -> BatchedVADStream:
        stream = BatchedVADStream(self, dataclasses.replace(self._opts), self.batch)
        self._streams.add(stream)
        return stream
