"""A client's mic as every socket door takes it (`MicFramer`): PCM at its rate -> 20 ms
frames at 16 kHz (what the VAD and the ear take), each stamped with when its samples were
sent (speech_end.stamp), so a turn's end is when the caller stopped, not when a busy loop
read it. `MicInput` queues them for a conversation's AgentSession (both socket doors);
`/v1/realtime`'s input buffer (no server VAD) keeps them for the client's commit.

The client's audio clock: a mic sends its audio in real time, so the message whose audio
ends at position p was sent at p + the smallest (arrival - position) of the last
CLOCK_WINDOW_S. A message read late (the loop was busy) keeps the time it was sent; one
that arrived on time keeps its arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from livekit import rtc
from livekit.agents.utils.audio import AudioByteStream
from livekit.agents.voice import io
from prometheus_client import Counter

from ..metrics import REGISTRY
from ..speech_end import VAD_RATE, stamp

log = logging.getLogger("voice_agent.mic")

MAX_BACKLOG_S = 5.0  # mic audio the session may lag behind the client (older is dropped)

MIC_DROPPED = Counter("agent_mic_frames_dropped_total",
                      "Mic frames dropped because the conversation fell behind reading them "
                      f"(over {MAX_BACKLOG_S:.0f} s queued): the agent was busy, not the "
                      "client too fast", registry=REGISTRY)

CLOCK_WINDOW_S = 2.0  # how long a mic's audio clock is followed (`_sent_at`)


class MicFramer:
    """int16 mono PCM at `input_rate` in, stamped 16 kHz frames of `frame_ms` out."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        self.input_rate = input_rate
        self._resampler = (rtc.AudioResampler(input_rate=input_rate, output_rate=VAD_RATE,
                                              num_channels=1)
                           if input_rate != VAD_RATE else None)
        self._framer = AudioByteStream(VAD_RATE, 1,
                                       samples_per_channel=VAD_RATE * frame_ms // 1000)
        self.received_s = 0.0  # audio received, seconds
        self._unframed: deque[list[float]] = deque()  # [16 kHz samples, perf time sent]
        self._offsets: deque[tuple[float, float]] = deque()  # (arrived, arrived - position)

    def push(self, pcm: bytes) -> list[rtc.AudioFrame]:
        """One message's audio: the whole frames it completes, stamped."""
        self.received_s += len(pcm) / 2 / self.input_rate
        sent = self._sent_at(time.perf_counter())
        if self._resampler is not None:
            frame = rtc.AudioFrame(data=pcm, sample_rate=self.input_rate, num_channels=1,
                                   samples_per_channel=len(pcm) // 2)
            pcm = b"".join(bytes(f.data) for f in self._resampler.push(frame))
        if pcm:
            self._unframed.append([len(pcm) // 2, sent])
        return [stamp(f, self._arrivals(f.samples_per_channel)) for f in self._framer.push(pcm)]

    def flush(self) -> list[rtc.AudioFrame]:
        """The partial frame held back (a commit takes all that was sent)."""
        return [stamp(f, self._arrivals(f.samples_per_channel)) for f in self._framer.flush()]

    def _sent_at(self, arrived: float) -> float:
        """When the message just received (its audio ends at `received_s`) was sent: its
        position on the client's real-time audio clock (a sliding-window minimum)."""
        offset = arrived - self.received_s
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((arrived, offset))
        while self._offsets[0][0] < arrived - CLOCK_WINDOW_S:
            self._offsets.popleft()
        return self.received_s + self._offsets[0][1]

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


class MicInput(io.AudioInput):
    """A socket client's mic as a conversation's audio input: PCM at its rate -> stamped
    20 ms frames at 16 kHz (`MicFramer`), queued for the session as they arrive.

    A conversation that falls behind reading (its pipeline busy: starting, or an
    overloaded host) keeps the newest MAX_BACKLOG_S and drops the oldest, with a log line
    and `agent_mic_frames_dropped_total`: the call goes on."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        super().__init__(label="MicInput")
        self.mic = MicFramer(input_rate, frame_ms)
        self.input_rate = input_rate  # the client's mic PCM, Hz
        self._queue: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue(
            maxsize=int(MAX_BACKLOG_S * 1000 / frame_ms))
        self.dropped = 0  # frames dropped since the last log line

    def push(self, pcm: bytes) -> list[rtc.AudioFrame]:
        """One message's audio; returns the frames it completed (queued for the session)."""
        frames = self.mic.push(pcm)
        for f in frames:
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
        return frames

    def close(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    async def __anext__(self) -> rtc.AudioFrame:
        frame = await self._queue.get()
        if frame is None:
            self._queue.put_nowait(None)  # stays closed for any later reader
            raise StopAsyncIteration
        return frame
