"""probe_bot: joins the case's room, records the agent's audio track, slices the reply.

It subscribes to the agent's audio (the participant of kind AGENT, or the first one
publishing audio that is not the user bot), stamps every received frame with the
suite's clock, and after the first frame sends `probe_ready` (seed D9 barrier: a
probe that records before it is subscribed records silence). It collects the agent's
reply_start / reply_end marks (`ReplyMarks`) and latency reports; the messages are the
agent's contract, voice_agent.marks.

`slice_reply` is the pure part (unit-tested): the reply is cut at the marks; without
marks (an agent that does not speak the AutoRTC protocol) it falls back to energy: the
first audible frame after EoT up to the first silence longer than `end_silence_s`
(slicing="energy", shown in the report).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from voice_agent.marks import (
    AGENT_READY,
    PROBE_READY,
    REPLY_END,
    REPLY_START,
    TOPIC_AGENT,
    TOPIC_LATENCY,
    TOPIC_PROBE,
    decode,
    encode,
)

from .audio import to_float
from .faults import Received

PROBE_RATE = 48000  # what WebRTC delivers; the metrics compare in the mel domain
SILENT_DBFS = -50.0


@dataclass
class Recording:
    rate: int = PROBE_RATE
    frames: list[np.ndarray] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)

    def add(self, pcm: np.ndarray, at: float) -> None:
        self.frames.append(pcm)
        self.arrivals.append(at)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.frames) if self.frames else np.zeros(0, np.float32)


@dataclass
class ReplyMarks:
    """reply_start / reply_end marks of one case, stamped with the probe's clock.

    Matched on (trace_id, case_id, reply_seq); start and end must carry the same
    reply_seq; a mark with another trace_id (a stale agent from an earlier case) is
    ignored (seed 003 13.1)."""

    trace_id: str
    case_id: str
    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    ignored: int = 0  # stale or foreign marks
    agent_trace_ids: list[str] = field(default_factory=list)

    def add(self, msg: dict[str, object], at: float) -> bool:
        kind = msg.get("type")
        if kind not in (REPLY_START, REPLY_END):
            return False
        seq = msg.get("reply_seq")
        if (msg.get("trace_id") != self.trace_id or msg.get("case_id") != self.case_id
                or not isinstance(seq, int)):
            self.ignored += 1
            return False
        (self.starts if kind == REPLY_START else self.ends).setdefault(seq, at)
        atid = msg.get("agent_trace_id")
        if isinstance(atid, str) and atid not in self.agent_trace_ids:
            self.agent_trace_ids.append(atid)
        return True

    def first_reply(self, after: float | None = None) -> tuple[float, float] | None:
        """(start, end) of the first complete reply starting at/after `after`."""
        for seq in sorted(self.starts):
            s = self.starts[seq]
            if (after is None or s >= after) and seq in self.ends and self.ends[seq] >= s:
                return s, self.ends[seq]
        return None


def _loud(frame: np.ndarray) -> bool:
    return len(frame) > 0 and 20 * np.log10(max(float(np.sqrt(np.mean(frame**2))), 1e-9)) \
        >= SILENT_DBFS


def slice_reply(rec: Recording, marks: ReplyMarks | None, eot: float | None,
                end_silence_s: float = 1.0) -> tuple[Received | None, str, float | None,
                                                     float | None]:
    """(reply, slicing, reply_start, reply_end) from the probe's frames."""
    if not rec.frames:
        return None, "none", None, None
    span = marks.first_reply(after=eot) if marks else None
    if span is not None:
        start, end = span
        idx = [i for i, t in enumerate(rec.arrivals) if start <= t <= end]
        slicing = "events"
    else:
        slicing = "energy"
        after = [i for i, t in enumerate(rec.arrivals) if eot is None or t >= eot]
        first = next((i for i in after if _loud(rec.frames[i])), None)
        if first is None:
            return None, slicing, None, None
        idx, quiet_since = [], None
        for i in range(first, len(rec.frames)):
            if _loud(rec.frames[i]):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = rec.arrivals[i]
            elif rec.arrivals[i] - quiet_since >= end_silence_s:
                break
            idx.append(i)
        while idx and not _loud(rec.frames[idx[-1]]):  # trailing silence is not reply
            idx.pop()
        start, end = rec.arrivals[idx[0]], rec.arrivals[idx[-1]]
    if not idx:
        return None, slicing, start, end
    fs = len(rec.frames[idx[0]])
    audio = np.concatenate([rec.frames[i] for i in idx])
    return Received(rec.rate, audio, [rec.arrivals[i] for i in idx], fs), slicing, start, end


class ProbeBot:
    """The LiveKit side of the probe (needs a LiveKit server; not run in CI)."""

    def __init__(self, trace_id: str, case_id: str, user_identity: str) -> None:
        self.trace_id, self.case_id, self.user_identity = trace_id, case_id, user_identity
        self.rec = Recording()
        self.marks = ReplyMarks(trace_id, case_id)
        self.latency: list[dict[str, object]] = []
        self.agent_ready = asyncio.Event()
        self.first_frame = asyncio.Event()
        self.reply_end = asyncio.Event()
        self.room: Any = None
        self._tasks: list[asyncio.Task[None]] = []

    async def connect(self, url: str, token: str) -> None:
        from livekit import rtc

        self.room = rtc.Room()

        @self.room.on("track_subscribed")
        def _on_track(track: Any, _pub: Any, participant: Any) -> None:
            if track.kind != rtc.TrackKind.KIND_AUDIO or participant.identity == \
                    self.user_identity:
                return
            stream = rtc.AudioStream(track, sample_rate=PROBE_RATE, num_channels=1)
            self._tasks.append(asyncio.create_task(self._record(stream)))

        @self.room.on("data_received")
        def _on_data(packet: Any) -> None:
            msg = decode(packet.data)
            if msg is None:
                return
            now = time.perf_counter()
            if packet.topic == TOPIC_AGENT:
                if msg.get("type") == AGENT_READY and msg.get("trace_id") == self.trace_id:
                    self.agent_ready.set()
                elif self.marks.add(msg, now) and msg.get("type") == REPLY_END:
                    self.reply_end.set()
            elif packet.topic == TOPIC_LATENCY:
                self.latency.append(msg)

        await self.room.connect(url, token)

    async def _record(self, stream: Any) -> None:
        async for ev in stream:
            pcm = to_float(bytes(ev.frame.data))
            self.rec.add(pcm, time.perf_counter())
            if not self.first_frame.is_set():
                self.first_frame.set()
                await self.room.local_participant.publish_data(
                    encode(PROBE_READY, self.trace_id, self.case_id), topic=TOPIC_PROBE)

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.room is not None:
            await self.room.disconnect()
