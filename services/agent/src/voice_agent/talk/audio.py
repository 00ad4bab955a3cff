"""The conversation's audio on its socket: the client's mic in (`SocketInput`: PCM at its
rate -> 20 ms frames at 16 kHz, each stamped with when it was sent), the reply out
(`SocketOutput`: paced frames, barge-in clears) through one ordered sender (`Outbox`).

Knows the protocol only as far as sending its events; nothing of admission, voices or
the pipeline's turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from aiohttp import web
from livekit import rtc
from livekit.agents.utils.audio import AudioByteStream
from livekit.agents.voice import io
from prometheus_client import Counter

from ..audio_io import PacedOutput
from ..metrics import REGISTRY
from ..speech_end import stamp
from .protocol import ProtocolError, Server, server_message

log = logging.getLogger("voice_agent.ws")

VAD_RATE = 16000  # what the VAD and the STT take
MAX_BACKLOG_S = 5.0  # mic audio the session may lag behind the client (older is dropped)
MAX_AHEAD_S = 5.0  # mic audio a client may send ahead of real time (else: too_fast)
CLOCK_WINDOW_S = 2.0  # how long a mic's audio clock is followed (SocketInput._sent_at)
MAX_OUTBOX_S = 10.0  # reply audio waiting for a client that does not read

MIC_DROPPED = Counter("agent_mic_frames_dropped_total",
                      "Mic frames dropped because the conversation fell behind reading them "
                      f"(over {MAX_BACKLOG_S:.0f} s queued): the agent was busy, not the "
                      "client too fast", registry=REGISTRY)



class Outbox:
    """What goes to the client, in order: JSON events and PCM frames, sent by one task.
    `drop_audio()` removes frames not yet sent (barge-in). A frame may carry a call made
    with the moment it was written to the socket (a reply's first frame: its latency)."""

    def __init__(self, ws: web.WebSocketResponse, frame_s: float) -> None:
        self._ws = ws
        self._items: deque[str | bytes | tuple[bytes, Callable[[float], None]]] = deque()
        self._ready = asyncio.Event()
        self._audio = 0
        self._max_audio = int(MAX_OUTBOX_S / frame_s)
        self.audio_sent = 0
        self.stalled = False  # the client stopped reading: the sender gives up

    def event(self, type_: Server, **fields: object) -> None:
        self._items.append(server_message(type_, **fields))
        self._ready.set()

    def audio(self, pcm: bytes, on_sent: Callable[[float], None] | None = None) -> None:
        if self._audio >= self._max_audio:
            self.stalled = True
        self._items.append(pcm if on_sent is None else (pcm, on_sent))
        self._audio += 1
        self._ready.set()

    def drop_audio(self) -> None:
        self._items = deque(x for x in self._items if isinstance(x, str))
        self._audio = 0

    async def run(self) -> None:
        """Send until cancelled; returns when the client is gone."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._items:
                item = self._items.popleft()
                if self._ws.closed or self.stalled:
                    return
                try:
                    if isinstance(item, str):
                        await self._ws.send_str(item)
                        continue
                    pcm, on_sent = item if isinstance(item, tuple) else (item, None)
                    self._audio -= 1
                    await self._ws.send_bytes(pcm)
                    self.audio_sent += 1
                    if on_sent is not None:
                        on_sent(time.perf_counter())
                except (ConnectionError, RuntimeError):
                    return


class SocketInput(io.AudioInput):
    """The client's mic: PCM at its rate -> 20 ms frames at 16 kHz, as they arrive.

    Two limits, two causes. A client that sends audio faster than real time (more than
    MAX_AHEAD_S ahead of the clock since its first message) is refused: `too_fast`. A
    conversation that falls behind reading (its pipeline busy: starting, or an overloaded
    host) keeps the newest MAX_BACKLOG_S and drops the oldest, with a log line and
    `agent_mic_frames_dropped_total`: the call goes on.

    Each frame is stamped with when its samples were sent (speech_end.stamp), on the
    client's audio clock: a mic sends its audio in real time, so the message whose audio
    ends at position p was sent at p + the smallest (arrival - position) of the last
    CLOCK_WINDOW_S. A message read late (this loop was busy) keeps the time it was sent;
    one that arrived on time keeps its arrival."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        super().__init__(label="SocketInput")
        self._resampler = (rtc.AudioResampler(input_rate=input_rate, output_rate=VAD_RATE,
                                              num_channels=1)
                           if input_rate != VAD_RATE else None)
        self.input_rate = input_rate  # the client's mic PCM, Hz
        self._framer = AudioByteStream(VAD_RATE, 1, samples_per_channel=VAD_RATE * frame_ms // 1000)
        self._queue: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue(
            maxsize=int(MAX_BACKLOG_S * 1000 / frame_ms))
        self._t0: float | None = None  # monotonic time of the first audio
        self._received_s = 0.0  # audio received, seconds
        self._unframed: deque[list[float]] = deque()  # [16 kHz samples, perf time sent]
        self._offsets: deque[tuple[float, float]] = deque()  # (arrived, arrived - position)
        self.dropped = 0  # frames dropped since the last log line

    def push(self, pcm: bytes) -> None:
        now = time.monotonic()
        arrived = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self._received_s += len(pcm) / 2 / self.input_rate
        if self._received_s - (now - self._t0) > MAX_AHEAD_S:
            raise ProtocolError("too_fast", "mic audio arrives faster than real time "
                                f"(over {MAX_AHEAD_S:.0f} s ahead of the clock)")
        sent = self._sent_at(arrived)
        if self._resampler is not None:
            frame = rtc.AudioFrame(data=pcm, sample_rate=self.input_rate, num_channels=1,
                                   samples_per_channel=len(pcm) // 2)
            pcm = b"".join(bytes(f.data) for f in self._resampler.push(frame))
        if pcm:
            self._unframed.append([len(pcm) // 2, sent])
        for f in self._framer.push(pcm):
            stamp(f, self._arrivals(f.samples_per_channel))
            if self._queue.full():  # the conversation is behind: the oldest goes
                self._queue.get_nowait()
                MIC_DROPPED.inc()
                if not self.dropped:
                    log.warning("the conversation fell behind reading the mic (over %.0f s "
                                "queued: the agent is busy); dropping its oldest audio",
                                MAX_BACKLOG_S)
                self.dropped += 1
            elif self.dropped:
                log.info("the conversation caught up; %d mic frames (%d ms) were dropped",
                         self.dropped, self.dropped * 20)
                self.dropped = 0
            self._queue.put_nowait(f)

    def _sent_at(self, arrived: float) -> float:
        """When the message just received (its audio ends at `_received_s`) was sent: its
        position on the client's real-time audio clock (a sliding-window minimum)."""
        offset = arrived - self._received_s
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((arrived, offset))
        while self._offsets[0][0] < arrived - CLOCK_WINDOW_S:
            self._offsets.popleft()
        return self._received_s + self._offsets[0][1]

    def _arrivals(self, n: int) -> list[tuple[int, float]]:
        """When the next `n` samples were sent (speech_end.stamp): runs by message."""
        out: list[tuple[int, float]] = []
        done = 0
        while done < n and self._unframed:
            run = self._unframed[0]
            take = min(int(run[0]), n - done)
            done += take
            run[0] -= take
            out.append((done, run[1]))
            if not run[0]:
                self._unframed.popleft()
        return out

    def close(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    async def __anext__(self) -> rtc.AudioFrame:
        frame = await self._queue.get()
        if frame is None:
            self._queue.put_nowait(None)  # stays closed for any later reader
            raise StopAsyncIteration
        return frame


class SocketOutput(PacedOutput):
    """The client's loudspeaker, seen from here: the paced ticks of agent audio go out
    as they leave (the client plays as it receives); a clear drops what is queued for
    the socket and tells the client to flush its playout buffer. A reply's first audio
    is when its first frame was written to the socket (`on_first_audio`): a loop busy
    between the tick and the write delays what the caller hears."""

    def __init__(self, outbox: Outbox, *, sample_rate: int, frame_ms: int,
                 on_first_audio: Callable[[float], None]) -> None:
        super().__init__("SocketOutput", sample_rate=sample_rate, frame_ms=frame_ms,
                         on_first_audio=self._first_tick)
        self._outbox = outbox
        self._on_first_sent = on_first_audio
        self._first = False
        self._last_audible = float("-inf")

    def _first_tick(self, at: float) -> None:
        self._first = True

    def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
        if audible:
            first, self._first = self._first, False
            self._outbox.audio(chunk.ljust(self.frame_samples * 2, b"\0"),
                               self._on_first_sent if first else None)
            self._last_audible = at

    def _cleared(self, at: float) -> None:
        self._outbox.drop_audio()
        self._outbox.event(Server.CLEAR)

    def silent_from(self, t: float) -> float:
        """When the client stopped being sent audio, for a barge-in decided at `t`."""
        if self._last_audible < t - self._frame_s:
            return t
        return max(t, self._last_audible + self._frame_s)



class SocketCaptions(io.TextOutput):
    """The reply's words as `caption` deltas, in step with its audio: the session's
    TranscriptSynchronizer releases them as the paced audio plays (after a barge-in it
    releases none of that reply's)."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(label="talk-captions", next_in_chain=None)
        self._outbox = outbox

    async def capture_text(self, text: str) -> None:
        if text:
            self._outbox.event(Server.CAPTION, delta=text)

    def flush(self) -> None:
        pass  # the reply's transcript event ends it
