"""Audio input/output objects of our own, for running an AgentSession without a room.

`MicrophoneInput` is a real-time microphone: every `frame_ms` it yields a frame,
silence unless speech was queued with `play()`. Because it keeps time like a device,
the VAD, endpointing and barge-in behave as they would on a call.

`SpeakerOutput` (a `PacedOutput`, as is the WebSocket transport's output) is a real-time
loudspeaker: frames the session captures are played
out one `frame_ms` tick at a time on a wall-clock schedule, and every tick (speech or
silence) is appended to `recording`, so the recording is the agent's side of the call
on the same timeline as the microphone. `clear_buffer()` drops everything not yet
played, synchronously; the frame playing at that moment is the last one heard, so
silence follows within one frame. It reports playback started/finished to the
framework like a room track does (the framework uses that for the agent state and for
truncating interrupted replies to what was heard).

The microphone stamps each frame with its real-time slot (speech_end.stamp: the user's
end of speech is when its last sample arrived, however late the VAD reads it); the
paced outputs report how late each tick fired to the process's load monitor (load.py).
Otherwise neither knows anything about the agent: they are `voice.io.AudioInput`/`AudioOutput`.
What a test harness may watch is public and read-only: the microphone's delivery clock
(`t0`, `frames_sent`, `frame_s`) and, through an `OutputTap`, every frame an output
accepted and every tick it played (AutoRTC's sender and network model hang there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from livekit import rtc
from livekit.agents.voice import io

from .load import MONITOR
from .speech_end import stamp


class MicrophoneInput(io.AudioInput):
    def __init__(self, *, sample_rate: int = 16000, frame_ms: int = 20) -> None:
        super().__init__(label="MicrophoneInput")
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * frame_ms // 1000
        self._frame_s = frame_ms / 1000.0
        self._queue: list[tuple[np.ndarray, asyncio.Future[tuple[float, float]]]] = []
        self._cur: np.ndarray | None = None
        self._cur_pos = 0
        self._cur_fut: asyncio.Future[tuple[float, float]] | None = None
        self._cur_start = 0.0
        self._t0: float | None = None
        self._n = 0
        self._closed = False

    # --- the delivery clock (read-only): frame n is handed over at t0 + n * frame_s ----------
    @property
    def t0(self) -> float | None:
        """perf_counter when the first frame was delivered; None before that."""
        return self._t0

    @property
    def frames_sent(self) -> int:
        """Frames delivered so far (the next one is due at t0 + frames_sent * frame_s)."""
        return self._n

    @property
    def frame_s(self) -> float:
        return self._frame_s

    def play(self, pcm: np.ndarray | bytes) -> asyncio.Future[tuple[float, float]]:
        """Queue speech (int16 mono at `sample_rate`); resolves to (start, end) perf times.

        Times are on the delivery clock: frame n is handed to the session at
        t0 + n * frame and, like a device's, holds the `frame_ms` of audio before that;
        `start`/`end` are the delivery time of the frame holding the first/last sample
        plus that sample's offset in it (the sound itself was one frame earlier)."""
        samples = np.frombuffer(pcm, dtype=np.int16) if isinstance(pcm, bytes) else pcm
        fut: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()
        self._queue.append((samples.astype(np.int16, copy=False), fut))
        return fut

    def close(self) -> None:
        self._closed = True

    async def __anext__(self) -> rtc.AudioFrame:
        if self._closed:
            raise StopAsyncIteration
        if self._t0 is None:
            self._t0 = time.perf_counter()
        due = self._t0 + self._n * self._frame_s
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        self._n += 1
        # its samples are those of its real-time slot, however late it is read: they
        # were spoken then (a late read on a starved host does not move them, nor the
        # times `play` reports for them)
        return stamp(self._next_frame(due), ((self.frame_samples, due),))

    def _next_frame(self, now: float) -> rtc.AudioFrame:
        out = np.zeros(self.frame_samples, dtype=np.int16)
        filled = 0
        while filled < self.frame_samples:
            if self._cur is None:
                if not self._queue:
                    break
                self._cur, self._cur_fut = self._queue.pop(0)
                self._cur_pos = 0
                self._cur_start = now + filled / self.sample_rate
            take = min(self.frame_samples - filled, len(self._cur) - self._cur_pos)
            out[filled:filled + take] = self._cur[self._cur_pos:self._cur_pos + take]
            filled += take
            self._cur_pos += take
            if self._cur_pos >= len(self._cur):
                end = now + filled / self.sample_rate
                if self._cur_fut is not None and not self._cur_fut.done():
                    self._cur_fut.set_result((self._cur_start, end))
                self._cur, self._cur_fut = None, None
        return rtc.AudioFrame(data=out.tobytes(), sample_rate=self.sample_rate, num_channels=1,
                              samples_per_channel=self.frame_samples)


class OutputTap:
    """Watches a `PacedOutput` without changing what it does (override what you need).

    Calls run on the output's event loop, synchronously: they must not block."""

    def captured(self, at: float, pcm: bytes, segment: int) -> None:
        """A frame handed over at `at` (before the framework's bookkeeping) was accepted
        into playback segment `segment`; frames dropped after a clear are not reported."""

    def played(self, at: float, pcm: bytes, segment: int) -> None:
        """A tick that left at `at` carried (up to a frame of) agent audio of `segment`."""


@dataclass
class Tick:
    at: float  # perf_counter when the frame started playing
    audible: bool  # agent audio (True) or silence (False)


class PacedOutput(io.AudioOutput):
    """An output that keeps time like a device: captured frames leave one `frame_ms` tick
    at a time on a wall-clock schedule, so the playback position the framework reads is
    what has left. Subclasses say where each tick goes (`_tick`) and what a clear does
    besides dropping the buffer (`_cleared`). `tap` (an `OutputTap`, set before `start()`)
    sees what was captured and played. `pause()` holds the buffer (ticks are silence from
    the next one on) and `resume()` plays on from where it stopped.

    `on_demand` (a speaker that is a socket's clock: its client plays what it receives, as
    it comes): no ticks while nothing plays, and a reply's first tick as soon as its first
    frame is in, not at the next slot of a free-running grid (0-20 ms later, 10 on
    average, on every reply's first audio). A device keeps its grid."""

    on_demand = False

    def __init__(self, label: str, *, sample_rate: int, frame_ms: int,
                 on_first_audio: Callable[[float], None] | None = None,
                 tap: OutputTap | None = None) -> None:
        super().__init__(label=label, capabilities=io.AudioOutputCapabilities(pause=True),
                         sample_rate=sample_rate)
        self.frame_samples = sample_rate * frame_ms // 1000
        self._frame_s = frame_ms / 1000.0
        self._rate = sample_rate
        self._buf = bytearray()
        self._active = False  # a segment is being captured/played
        self._flushed = False
        self._discarding = False  # after clear_buffer, until the framework flushes
        self._paused = False
        self._played_s = 0.0  # of the current segment
        self._started = False
        self._on_first_audio = on_first_audio
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # on_demand: waiting for a reply
        self.segment = 0  # counts playback segments (one per reply)
        self.tap = tap

    @property
    def playing(self) -> bool:
        """A segment is being captured or played (until its last frame left, or a clear)."""
        return self._active

    def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
        """One tick left at `at`: up to a frame of agent audio, or silence."""

    def _cleared(self, at: float) -> None:
        """clear_buffer() dropped a segment that was playing."""

    # --- framework side -------------------------------------------------------------------
    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        at = time.perf_counter()
        await super().capture_frame(frame)
        if self._discarding:
            return
        if not self._active:
            self._active, self._flushed, self._played_s, self._started = True, False, 0.0, False
            self.segment += 1
        pcm = bytes(frame.data)
        self._buf += pcm
        if self.tap is not None:
            self.tap.captured(at, pcm, self.segment)
        self._wake()

    def flush(self) -> None:
        super().flush()
        if self._discarding:
            self._discarding = False
            return
        if self._active:
            self._flushed = True
            self._wake()

    def _wake(self) -> None:
        """An idle on_demand playout starts once a whole frame (or a short reply) is in."""
        idle = self._idle
        if (idle is not None and not idle.done() and self._active
                and (len(self._buf) >= self.frame_samples * 2 or self._flushed)):
            idle.set_result(None)

    def pause(self) -> None:
        super().pause()
        self._paused = True

    def resume(self) -> None:
        super().resume()
        self._paused = False

    def clear_buffer(self) -> None:
        now = time.perf_counter()
        self._buf.clear()
        if not self._active:
            return
        self._active = False
        self._discarding = not self._flushed
        self._cleared(now)
        self.on_playback_finished(playback_position=self._played_s, interrupted=True)

    # --- the device ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._playout(), name=f"{self.label}.playout")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _playout(self) -> None:
        t0 = time.perf_counter()
        n = 0
        nbytes = self.frame_samples * 2
        while True:
            if self.on_demand and not self._active:
                self._idle = asyncio.get_running_loop().create_future()
                self._wake()
                try:
                    await self._idle
                finally:
                    self._idle = None
                t0, n = time.perf_counter(), 0  # the reply's grid starts with it
            due = t0 + n * self._frame_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            n += 1
            at = time.perf_counter()
            MONITOR.tick_late(at - due)
            chunk = b"" if self._paused else bytes(self._buf[:nbytes])
            del self._buf[:len(chunk)]
            audible = bool(chunk) and self._active
            if audible:
                if not self._started:
                    self._started = True
                    if self._on_first_audio is not None:  # before the framework hears of it
                        self._on_first_audio(at)
                    self.on_playback_started(created_at=time.time())
                self._played_s += len(chunk) / 2 / self._rate
                if self.tap is not None:
                    self.tap.played(at, chunk, self.segment)
            self._tick(at, chunk, audible)
            if self._active and self._flushed and not self._buf and not self._paused:
                self._active = False
                self.on_playback_finished(playback_position=self._played_s, interrupted=False)


class SpeakerOutput(PacedOutput):
    def __init__(self, *, sample_rate: int = 24000, frame_ms: int = 20,
                 on_first_audio: Callable[[float], None] | None = None,
                 tap: OutputTap | None = None) -> None:
        super().__init__("SpeakerOutput", sample_rate=sample_rate, frame_ms=frame_ms,
                         on_first_audio=on_first_audio, tap=tap)
        self.recording = bytearray()
        self.ticks: list[Tick] = []
        self.clears: list[float] = []

    def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
        self.recording += chunk.ljust(self.frame_samples * 2, b"\0")
        self.ticks.append(Tick(at=at, audible=audible))

    def _cleared(self, at: float) -> None:
        self.clears.append(at)

    # --- measurements -----------------------------------------------------------------------------
    def silent_from(self, t: float) -> float:
        """When the output fell silent after moment `t`: the end of the last audible frame
        of the run playing at `t` (or `t` itself if nothing was playing)."""
        last_audible: float | None = None
        for tick in self.ticks:
            if tick.at < t - self._frame_s:
                continue
            if tick.audible:
                last_audible = tick.at
            elif tick.at >= t:
                break
        if last_audible is None:
            return t
        return max(t, last_audible + self._frame_s)

    def audible_seconds(self) -> float:
        return sum(1 for t in self.ticks if t.audible) * self._frame_s
