"""The conversation's audio on its socket: the client's mic in (`SocketInput`: PCM at its
rate -> 20 ms frames at 16 kHz, each stamped with when it was sent), the reply out
(`SocketOutput`: paced frames, barge-in clears) through the conversation's ordered
sender (`TalkOutbox`: conversation/outbox.py).

Knows the protocol only as far as sending its events; nothing of admission, voices or
the pipeline's turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import web
from livekit import rtc
from livekit.agents.voice import io
from prometheus_client import Counter

from ..audio_io import PacedOutput
from ..conversation.mic import MicFramer
from ..conversation.outbox import Outbox
from ..metrics import REGISTRY
from .protocol import ProtocolError, Server, server_message

log = logging.getLogger("voice_agent.ws")

MAX_BACKLOG_S = 5.0  # mic audio the session may lag behind the client (older is dropped)
MAX_AHEAD_S = 5.0  # mic audio a client may send ahead of real time (else: too_fast)
MAX_OUTBOX_S = 10.0  # reply audio waiting for a client that reads too slowly

MIC_DROPPED = Counter("agent_mic_frames_dropped_total",
                      "Mic frames dropped because the conversation fell behind reading them "
                      f"(over {MAX_BACKLOG_S:.0f} s queued): the agent was busy, not the "
                      "client too fast", registry=REGISTRY)



class TalkOutbox(Outbox):
    """The conversation's outbox (conversation/outbox.py) in this protocol's words."""

    def __init__(self, ws: web.WebSocketResponse, frame_s: float, name: str) -> None:
        # bounded by MAX_OUTBOX_S of reply frames (events are few beside them)
        super().__init__(ws.send_str, ws.send_bytes, max_items=int(MAX_OUTBOX_S / frame_s),
                         name=name)

    def event(self, type_: Server, **fields: object) -> None:
        self.text(server_message(type_, **fields))


class SocketInput(io.AudioInput):
    """The client's mic: PCM at its rate -> stamped 20 ms frames at 16 kHz, as they arrive
    (conversation/mic.py), queued for the session.

    Two limits, two causes. A client that sends audio faster than real time (more than
    MAX_AHEAD_S ahead of the clock since its first message) is refused: `too_fast`. A
    conversation that falls behind reading (its pipeline busy: starting, or an overloaded
    host) keeps the newest MAX_BACKLOG_S and drops the oldest, with a log line and
    `agent_mic_frames_dropped_total`: the call goes on."""

    def __init__(self, input_rate: int, frame_ms: int = 20) -> None:
        super().__init__(label="SocketInput")
        self._mic = MicFramer(input_rate, frame_ms)
        self.input_rate = input_rate  # the client's mic PCM, Hz
        self._queue: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue(
            maxsize=int(MAX_BACKLOG_S * 1000 / frame_ms))
        self._t0: float | None = None  # monotonic time of the first audio
        self.dropped = 0  # frames dropped since the last log line

    def push(self, pcm: bytes) -> None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if self._mic.received_s + len(pcm) / 2 / self.input_rate - (now - self._t0) \
                > MAX_AHEAD_S:
            raise ProtocolError("too_fast", "mic audio arrives faster than real time "
                                f"(over {MAX_AHEAD_S:.0f} s ahead of the clock)")
        for f in self._mic.push(pcm):
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

    def __init__(self, outbox: TalkOutbox, *, sample_rate: int, frame_ms: int,
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
            self._outbox.binary(chunk.ljust(self.frame_samples * 2, b"\0"),
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

    def __init__(self, outbox: TalkOutbox) -> None:
        super().__init__(label="talk-captions", next_in_chain=None)
        self._outbox = outbox

    async def capture_text(self, text: str) -> None:
        if text:
            self._outbox.event(Server.CAPTION, delta=text)

    def flush(self) -> None:
        pass  # the reply's transcript event ends it
