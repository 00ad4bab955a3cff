"""A client's mic as every socket door takes it (`MicFramer`): PCM at its rate -> 20 ms
frames at 16 kHz (what the VAD and the ear take), each stamped with when its samples were
sent (speech_end.stamp), so a turn's end is when the caller stopped, not when a busy loop
read it. `/v1/talk` queues these frames for its AgentSession (talk/audio.py SocketInput);
`/v1/realtime` feeds them to its VAD and input buffer.

The client's audio clock: a mic sends its audio in real time, so the message whose audio
ends at position p was sent at p + the smallest (arrival - position) of the last
CLOCK_WINDOW_S. A message read late (the loop was busy) keeps the time it was sent; one
that arrived on time keeps its arrival.
"""

from __future__ import annotations

import time
from collections import deque

from livekit import rtc
from livekit.agents.utils.audio import AudioByteStream

from ..speech_end import VAD_RATE, stamp

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
