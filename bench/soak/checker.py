"""One call as the client saw it (`Record`) and its stream's invariants (`StreamChecker`)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from voice.tts.v1 import tts_pb2

# Event TRUNCATED (the frame cap ended an utterance); by number, for stubs without it.
TRUNCATED = 6


@dataclass
class Record:
    """What one call did, as the client saw it (times in ms from dispatch)."""

    index: int
    kind: str
    chars: int
    max_frames: int
    dispatch_late_ms: float = 0.0
    outcome: str = ""              # ok | rejected | cancelled | error | timeout | hung
    code: str = ""
    message: str = ""
    started_ms: float | None = None
    ttfa_ms: float | None = None
    server_ttfa_ms: float | None = None
    # the server's split of its TTFA (FIRST_AUDIO timings): waiting for the engine, the
    # prompt, until the engine's first packet
    server_parts_ms: dict[str, float] = field(default_factory=dict)
    e2e_ms: float | None = None
    end_ms: float | None = None
    frames: int = 0
    utterances: int = 0            # utterances with audio
    truncated: int = 0             # utterances ended by the frame cap (Event TRUNCATED)
    late_frames: int = 0
    late20_frames: int = 0         # frames more than 20 / 100 ms behind the player
    late100_frames: int = 0
    late_utterances: int = 0
    max_late_ms: float = 0.0
    action: str = ""               # stop | reset | cancel | skipped (utterance ended first)
    reset_ttfa_ms: float | None = None
    violations: list[str] = field(default_factory=list)
    dispatch_at: float = 0.0       # time.monotonic() at dispatch (one clock for all procs)
    voice: str = ""                # SessionConfig.voice


class StreamChecker:
    """The stream's invariants and the player's clock, fed one response at a time."""

    def __init__(self, rec: Record, t_dispatch: float, frame_ms: int, frame_bytes: int,
                 tolerance_s: float) -> None:
        self.rec = rec
        self.t0 = t_dispatch
        self.frame_s = frame_ms / 1e3
        self.frame_ms = frame_ms
        self.frame_bytes = frame_bytes
        self.tol = tolerance_s
        self.seq = 0
        self.started = False
        self.min_uid = 0               # frames below this utterance id must not come
        self.uid = -1                  # utterance of the last frame
        self.first_audio: set[int] = set()
        self.closed_utts: set[int] = set()   # last_in_utterance seen
        self.utt_start: float = 0.0
        self.utt_k = 0
        self.utt_late = 0
        self.events: dict[str, asyncio.Event] = {}
        self.flushed: dict[int, float] = {}  # utterance id -> arrival
        self.first_frame_at: dict[int, float] = {}
        self.stopped_uid: int | None = None
        self.reset_uid: int | None = None
        self.after_stop = False
        self.silent_after_stop = rec.kind == "stop"
        self.new_first_frame: float | None = None  # first frame after STOPPED/RESET

    def ev(self, name: str) -> asyncio.Event:
        e = self.events.get(name)
        if e is None:
            e = self.events[name] = asyncio.Event()
        return e

    def bad(self, what: str) -> None:
        if len(self.rec.violations) < 5:
            self.rec.violations.append(what)

    def audio(self, f: tts_pb2.AudioFrame, now: float) -> None:
        if not self.started:
            self.bad("audio before SESSION_STARTED")
        if f.seq != self.seq:
            self.bad(f"seq {f.seq}, expected {self.seq}")
            self.seq = f.seq
        if f.start_ms != f.seq * self.frame_ms:
            self.bad(f"start_ms {f.start_ms} at seq {f.seq}")
        n = f.frames or 1  # frames in this message (SessionConfig.frames_per_message)
        if len(f.pcm) != n * self.frame_bytes:
            self.bad(f"{n} frame(s) of {len(f.pcm)} bytes, expected {n * self.frame_bytes}")
        uid = f.utterance_id
        if self.after_stop and self.silent_after_stop:
            self.bad("a frame after STOPPED (no text was sent after STOP)")
        if uid < self.min_uid:
            self.bad(f"frame of utterance {uid} after its STOPPED/RESET")
        if uid < self.uid:
            self.bad(f"utterance id went back {self.uid} -> {uid}")
        if uid in self.closed_utts:
            self.bad(f"frame of utterance {uid} after its last_in_utterance")
        if uid in self.flushed:
            self.bad(f"frame of utterance {uid} after its FLUSHED")
        if uid not in self.first_audio:
            self.bad(f"utterance {uid}: frame before FIRST_AUDIO")
            self.first_audio.add(uid)
        self.seq += n
        self.rec.frames += n
        first = 0
        if uid != self.uid:  # a player starts at the utterance's first frame
            self._close_utterance()
            self.uid, self.utt_start, self.utt_k, self.utt_late = uid, now, 0, 0
            self.first_frame_at[uid] = now
            self.rec.utterances += 1
            if self.after_stop and self.new_first_frame is None:
                self.new_first_frame = now
            if uid == 0:
                self.rec.ttfa_ms = (now - self.t0) * 1e3
                self.ev("first_audio").set()
            first = 1
        for k in range(self.utt_k + first, self.utt_k + n):  # each frame against its time
            late = now - (self.utt_start + k * self.frame_s)
            if late > self.tol:
                self.utt_late += 1
                self.rec.late_frames += 1
            self.rec.late20_frames += late > 0.020
            self.rec.late100_frames += late > 0.100
            if late * 1e3 > self.rec.max_late_ms:
                self.rec.max_late_ms = late * 1e3
        self.utt_k += n
        if f.last_in_utterance:
            self.closed_utts.add(uid)

    def _close_utterance(self) -> None:
        if self.uid >= 0 and self.utt_late:
            self.rec.late_utterances += 1
        self.utt_late = 0

    def event(self, e: tts_pb2.Event, now: float) -> None:
        t = e.type
        if t == tts_pb2.Event.SESSION_STARTED:
            if self.started or self.seq:
                self.bad("SESSION_STARTED not first / twice")
            self.started = True
            self.rec.started_ms = (now - self.t0) * 1e3
            return
        if not self.started:
            self.bad(f"event {t} before SESSION_STARTED")
        if e.next_seq != self.seq:
            self.bad(f"event {tts_pb2.Event.Type.Name(t)} next_seq {e.next_seq}, "
                     f"{self.seq} frames sent")
        uid = e.utterance_id
        if t == tts_pb2.Event.FIRST_AUDIO:
            if uid in self.first_audio:
                self.bad(f"second FIRST_AUDIO of utterance {uid}")
            if uid < self.min_uid:
                self.bad(f"FIRST_AUDIO of utterance {uid} after its STOPPED/RESET")
            self.first_audio.add(uid)
            if uid == 0:
                tm = e.timings
                self.rec.server_ttfa_ms = tm.ttfa_ms
                self.rec.server_parts_ms = {"queue": tm.queue_ms, "prefill": tm.prefill_ms,
                                            "first_packet": tm.first_packet_ms}
        elif t == tts_pb2.Event.FLUSHED:
            if uid in self.first_audio and uid >= self.min_uid and uid not in self.closed_utts:
                self.bad(f"FLUSHED of utterance {uid} without its last_in_utterance frame")
            self.flushed[uid] = now
            self.ev(f"flushed{uid}").set()
            if self.after_stop and uid >= self.min_uid:  # the new text's utterance
                self.ev("flushed_new").set()
        elif t == TRUNCATED:  # the frame cap ended it: after its last frame
            if uid in self.first_audio and uid not in self.closed_utts:
                self.bad(f"TRUNCATED of utterance {uid} before its last_in_utterance frame")
            self.closed_utts.add(uid)
            self.rec.truncated += 1
        elif t in (tts_pb2.Event.STOPPED, tts_pb2.Event.RESET):
            # Nothing of an utterance that had begun (any frame or FIRST_AUDIO seen) may
            # follow. (Which id the event carries changed over the protocol's versions:
            # the dropped one or the next one; only the rule above is relied on.)
            seen = max(self.first_audio | self.closed_utts | {self.uid, uid - 1})
            self.min_uid = max(self.min_uid, seen + 1)
            self.after_stop = True
            if t == tts_pb2.Event.STOPPED:
                self.stopped_uid = uid
                self.ev("stopped").set()
            else:
                self.reset_uid = uid
                self.ev("reset").set()
        else:
            self.bad(f"unknown event type {t}")

    def finish(self) -> None:
        self._close_utterance()


async def settle(chk: StreamChecker, driver: asyncio.Task) -> None:
    """A call's end: the checker finishes; a driver task still running is cancelled, one
    that failed is the stream's fault."""
    chk.finish()
    if not driver.done():
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await driver
    elif not driver.cancelled() and driver.exception() is not None:
        chk.bad(f"client driver failed: {driver.exception()!r}"[:200])
