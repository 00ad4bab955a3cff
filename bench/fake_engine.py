"""`FakeFastEngine`: a STAND-IN for the TTS engine, for benchmarking the server front only.

It is not a model: it implements the engine surface the server uses (`open_session`,
`voices`, `languages`, `on_step`, `start`, `shutdown`, the fault hooks; sessions with
`push_text`, `flush`, `cancel`, `reset`, `pause`, `resume`, `utterance_id`, `close`) and
emits noise
`AudioPacket`s and `UtteranceEnd`s from one thread, so that the gRPC front (Synthesis,
stream.py, framing, grpc.aio) can be driven at a chosen packet rate with no model in the
way. Used by bench/front_bench.py only.

Its steps behave like the real engine's: every step advances every speaking session by
one codec frame (1920 samples, 80 ms), packets of `first_packet_frames` then the
engine's ramp up to `packet_frames`, and a step at batch b takes `period_ms(b) = base_ms +
per_row_ms * b` (wall time, slept), reported to `on_step` as `StepStats` exactly as the
engine does. So with `per_row_ms > 0` it has a capacity (the batch at which the period
reaches the admission budget) that the server's capacity model learns from its stats.

An utterance starts at its first text (no tokenizer, no waiting for stable words) and
ends after `SessionParams.max_frames` frames (default `default_frames`), flushed or not.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from voice_tts.engine import AudioPacket, EngineFull, StepStats, UtteranceEnd, Voice, to_s16
from voice_tts.engine.api import packet_ramp
from voice_tts.engine.config import PRESETS
from voice_tts.engine.voices.table import VoiceTable

FRAME_SAMPLES = 1920


@dataclass
class _Utt:
    id: int
    frames: int  # to make
    done: int = 0
    emitted: int = 0


@dataclass
class FakeSession:
    engine: FakeFastEngine
    id: int
    max_frames: int
    sink: Any
    utts: list[_Utt] = field(default_factory=list)
    open_utt: _Utt | None = None  # takes text until flush
    next_id: int = 0
    paused: bool = False
    closed: bool = False

    def push_text(self, piece: str | bytes) -> None:
        with self.engine.lock:
            if self.open_utt is None:
                self.open_utt = _Utt(self.next_id, self.max_frames)
                self.next_id += 1
                self.utts.append(self.open_utt)
        self.engine.wake.set()

    def flush(self) -> None:
        with self.engine.lock:
            self.open_utt = None

    def cancel(self) -> None:
        with self.engine.lock:
            for u in self.utts:
                self.sink(UtteranceEnd(u.id, u.emitted, "cancelled"))
            self.utts.clear()
            self.open_utt = None

    def reset(self, seed: int | None = None) -> None:
        self.cancel()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    @property
    def utterance_id(self) -> int:
        with self.engine.lock:
            return self.open_utt.id if self.open_utt is not None else self.next_id

    def close(self) -> None:
        with self.engine.lock:
            self.utts.clear()
            self.open_utt = None
            self.closed = True
            self.engine.sessions.pop(self.id, None)


class FakeFastEngine:
    """STAND-IN engine (see the module docstring): noise packets at a modelled step rate."""

    def __init__(self, max_sessions: int = 1024, base_ms: float = 4.0,
                 per_row_ms: float = 0.0, first_packet_frames: int = 1,
                 packet_frames: int = 4, default_frames: int = 100) -> None:
        self.max_sessions = max_sessions
        self.base_ms, self.per_row_ms = base_ms, per_row_ms
        self.first_packet_frames, self.packet_frames = first_packet_frames, packet_frames
        self.bucket_step_ms: dict[int, float] = {}  # no warm-up timing: learned online
        self.default_frames = default_frames
        self.model_name = "fake-fast-engine (stand-in, noise)"
        self.sample_rate, self.frame_samples = 24000, FRAME_SAMPLES
        self.device = SimpleNamespace(type="cpu")
        # the tiny preset's voice names and languages (the server resolves against them)
        tiny = PRESETS["tiny"]
        self.voice_table = VoiceTable(tiny.talker, tiny.tts_model_type)
        self.on_step = None
        self.fatal = None  # the real engine's fault surface (server.py): never set here
        self.on_fatal = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.sessions: dict[int, FakeSession] = {}
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        # One noise buffer; packets are views of it (no allocation per packet).
        rng = np.random.default_rng(0)
        self._noise = (rng.standard_normal(FRAME_SAMPLES * max(packet_frames,
                                                                first_packet_frames))
                       * 0.1).astype(np.float32)
        self._noise16 = to_s16(self._noise).tobytes()  # as the engine: s16 made off the loop

    def stalled_for(self) -> float:
        return 0.0

    def period_ms(self, batch: int) -> float:
        return self.base_ms + self.per_row_ms * batch

    def voices(self) -> list[Voice]:
        return self.voice_table.voices()

    def languages(self) -> list[str]:
        return self.voice_table.languages()

    def open_session(self, params: Any, sink: Any) -> FakeSession:
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                raise EngineFull(f"engine full: {self.max_sessions} sessions active")
            s = FakeSession(self, self._next, params.max_frames or self.default_frames, sink)
            self.sessions[s.id] = s
            self._next += 1
            return s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def thread_cpu_s(self) -> float:
        """The stand-in thread's CPU seconds, read live from its kernel clock (ns), so that
        a window's process CPU minus this is the front's (a value the thread stored after
        each step lagged it and made that difference negative on a busy host)."""
        if self._thread is None or self._thread.ident is None:
            return 0.0
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            with self.lock:
                rows = [(s, s.utts[0]) for s in self.sessions.values()
                        if s.utts and not s.paused]
            if not rows:
                self.wake.wait(0.05)
                self.wake.clear()
                next_at = time.perf_counter()
                continue
            period = self.period_ms(len(rows)) / 1e3
            next_at = max(next_at + period, t0)  # the step "runs" for its period
            time.sleep(max(0.0, next_at - time.perf_counter()))
            with self.lock:
                for s, u in rows:
                    if s.closed or not s.utts or s.utts[0] is not u:
                        continue  # cancelled or closed meanwhile
                    u.done += 1
                    final = u.done >= u.frames
                    size = packet_ramp(u.emitted, self.first_packet_frames,
                                       self.packet_frames)
                    if u.done - u.emitted >= size or final:
                        n = u.done - u.emitted
                        timings = ({"queue_ms": 0.0, "prefill_ms": 0.0,
                                    "first_packet_ms": period * 1e3} if u.emitted == 0
                                   else None)
                        s.sink(AudioPacket(u.id, self._noise[: n * FRAME_SAMPLES], u.emitted,
                                           n, timings, None, final=final,
                                           pcm16=self._noise16[: n * FRAME_SAMPLES * 2]))
                        u.emitted = u.done
                    if final:
                        s.utts.pop(0)
                        if s.open_utt is u:
                            s.open_utt = None
                            s.next_id = max(s.next_id, u.id + 1)
                        s.sink(UtteranceEnd(u.id, u.done, "eos"))
            self.steps += 1
            if self.on_step is not None:
                self.on_step(StepStats(len(rows), (time.perf_counter() - t0) * 1e3,
                                       0.0, 0.0, 0.0))
