"""One synthesis call (gRPC `Synthesize`, an HTTP speech request or a WebSocket
session, each turned into the call's requests by its front: `messages.py`): requests are
read in one task while frames and events are written.

Three producers feed one ordered queue that the writer drains:
- the engine thread (through `sink`): `AudioPacket`, `UtteranceEnd`;
- the reader task: markers for FLUSH / STOP / RESET / end of input / errors.
Order in the queue is the order on the wire, with one exception that makes barge-in
immediate: STOP and RESET move `drop_below` forward *synchronously*, so every frame of an
older utterance still queued (or half framed) is dropped before the STOPPED event goes
out, and nothing of it is written after.

**Pacing** (`pace_lead_s`, TTS_PACE_LEAD_S; `pacing.py`): frame i of an utterance is
written no earlier than lead before its time on a player started at the first frame.
Engine items that come while the writer sleeps wait for its wakeup; markers (STOP, RESET,
FLUSH, end of input, failures) wake it at once, so STOPPED still goes out at once and no
frame of the stopped utterance after it. Events keep their place among the frames
(`_out` holds both; seq / next_seq are given as they are written). What the metrics mean
is unchanged: TTFA and RTF are taken when the engine's audio reaches the loop
(`_enqueue_engine`), not when paced frames are written. Flow control counts the audio
not yet written: queued engine audio plus framed frames waiting for their time. An
utterance is over (its reason counted) once its last frame is written: a STOP before that
counts it as cancelled. On a drain the writer stops pacing (`hurry`), so that in-flight
utterances end within the drain timeout.

An utterance's newest frame is held back until the next packet or its end: the engine
learns that a frame was the last one step later (codec EOS), and exactly one frame of
each utterance carries `last_in_utterance`. The packet's other frames go out at once.

This module knows the protocol's streaming rules; validation is in `protocol.py`, frame
cutting in `framing.py`, the engine behind the `Session` API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from voice_tts.engine import AudioPacket, UtteranceEnd
from voice_tts.engine.session import Sink
from voice_tts.server.call.framing import UtteranceFramer
from voice_tts.server.call.messages import (
    AudioFrame,
    Control,
    Event,
    EventKind,
    FirstAudio,
    Output,
    Request,
    ResolvedConfig,
    SessionConfig,
    Text,
    Timings,
)
from voice_tts.server.call.pacing import Inbox, Pacer
from voice_tts.server.errors import CallError, invalid
from voice_tts.server.metrics import CallMetrics

log = logging.getLogger("voice_tts.stream")

# Entries of the writer's `_out`, in wire order: `AudioFrame`s (one message: up to
# `frames_per_message` frames of one engine packet; written as they are) and these.


class _End(NamedTuple):
    """The utterance is over (counted and forgotten once written)."""

    utterance_id: int
    reason: str
    kinds: tuple[EventKind, ...]  # events after its last frame (TRUNCATED, FLUSHED)


class _Event(NamedTuple):
    utterance_id: int
    kind: EventKind
    tied: bool  # tied to a stopped utterance's audio: dropped with it


_Entry = AudioFrame | _End | _Event


@dataclass
class _Flush:
    utterance_id: int
    empty: bool  # nothing to speak: answer FLUSHED at once


@dataclass
class _Stop:
    reset: bool
    utterance_id: int  # the newest utterance it dropped (else the next one)


@dataclass
class _EndOfInput:
    pass


@dataclass
class _Failed:
    error: CallError


@dataclass
class _Utterance:
    first_text_at: float | None = None
    text_chars: int = 0
    has_speech: bool = False  # any non-whitespace text: worth flushing to the engine
    framer: UtteranceFramer | None = None
    # Its newest frame, held back until the next packet or its end says whether it is the
    # last (codec EOS comes one engine step after the last frame: engine.output).
    held: bytes | None = None
    held_chars: int = 0            # the text its packet had read (AudioPacket.text_chars)
    made: int = 0                  # frames framed (the next one's index)
    t0: float = -math.inf          # loop time its first frame was written (pacing)
    ttfa_s: float | None = None    # first text -> its first audio on the loop
    timings: dict | None = None    # the engine's, from its first packet


@dataclass
class StreamState:
    cfg: ResolvedConfig
    queue: Inbox = field(default_factory=Inbox)
    drop_below: int = 0            # utterances below this id are dropped (STOP/RESET)
    utterances: dict[int, _Utterance] = field(default_factory=dict)
    flushes: set[int] = field(default_factory=set)  # utterance ids awaiting FLUSHED
    open_ended: int | None = None  # ended (frame cap, EOS) before its FLUSH came
    backlog_samples: int = 0       # engine audio queued but not yet framed
    pending_frames: int = 0        # framed, not yet written (waiting for their time)
    paused: bool = False

    def utt(self, uid: int) -> _Utterance:
        return self.utterances.setdefault(uid, _Utterance())


@dataclass(frozen=True)
class Codec:
    """The engine's audio: its sample rate and the samples of one codec frame."""

    sample_rate: int
    frame_samples: int

    @property
    def frame_s(self) -> float:
        """Audio seconds of one codec frame (80 ms)."""
        return self.frame_samples / self.sample_rate


class SynthesizeStream:
    """`open_session(sink)` opens the call's engine session, whose audio goes to `sink`
    (this stream's): the stream has its session from its construction on."""

    def __init__(self, cfg: ResolvedConfig, open_session: Callable[[Sink], Any],
                 metrics: CallMetrics, codec: Codec, max_backlog_s: float,
                 pace_lead_s: float = 0.0) -> None:
        self.state = StreamState(cfg)
        self.metrics = metrics
        self.codec = codec
        self.max_backlog = int(max_backlog_s * codec.sample_rate)  # engine samples
        self._frame_native = codec.sample_rate * cfg.frame_ms // 1000  # a frame, in those
        self._per_message = cfg.frames_per_message
        self._out: deque[_Entry] = deque()  # framed, not yet written: frames and events
        self.seq = 0
        self.ttfas_ms: list[float] = []  # each utterance's, in order (the end line says them)
        self.loop = asyncio.get_running_loop()
        self.pacer = Pacer(pace_lead_s, cfg.frame_ms / 1e3, self.loop.time)
        self._ending = False
        self._aborted: CallError | None = None
        self.session = open_session(self.sink)

    def abort(self, error: CallError) -> None:
        """End the call with `error` at the writer's next turn, ahead of queued audio (the
        server cuts it: drain timeout, engine fault)."""
        self._aborted = error
        self.state.queue.put_nowait(_Failed(error))

    def hurry(self) -> None:
        """Stop pacing: what is left goes out as fast as the client reads (drain)."""
        self.pacer.hurry()
        self.state.queue.wake()

    def _backlog(self) -> int:
        """Audio not yet written, in engine samples: queued + framed and waiting."""
        st = self.state
        return st.backlog_samples + st.pending_frames * self._frame_native

    def _maybe_resume(self) -> None:
        st = self.state
        if st.paused and self._backlog() < self.max_backlog // 2:
            st.paused = False
            self.session.resume()

    # -- engine thread side ------------------------------------------------------------
    def sink(self, item: AudioPacket | UtteranceEnd) -> None:
        """Called by the engine thread; hands the item to the event loop."""
        # A closed loop means the call is gone: nothing to deliver to.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._enqueue_engine, item)

    def _enqueue_engine(self, item: AudioPacket | UtteranceEnd) -> None:
        st = self.state
        uid = item.utterance_id
        if isinstance(item, AudioPacket):
            st.backlog_samples += item.pcm.size
            # Flow control: a reader that falls behind (or paced audio far ahead) pauses
            # its own session in the engine instead of growing this queue without bound.
            if not st.paused and self._backlog() > self.max_backlog:
                st.paused = True
                self.metrics.flow_pauses.inc()
                self.session.pause()
            if uid >= st.drop_below:
                u = st.utt(uid)
                if u.ttfa_s is None:  # synthesis time: taken here, not when written
                    self._ttfa(uid, u, item.timings)
        elif (uid >= st.drop_below and item.frames > 0
              and item.reason not in ("cancelled", "invalid", "error")):
            u = st.utterances.get(uid)
            if u is not None and u.first_text_at is not None:
                audio_s = item.frames * self.codec.frame_s
                self.metrics.rtf.observe((time.perf_counter() - u.first_text_at) / audio_s)
        st.queue.put_nowait(item, urgent=False)

    # -- reader ------------------------------------------------------------------------
    async def read(self, requests: AsyncIterator[Request]) -> None:
        """The client's messages after its config (parsed by its protocol's front; one
        that cannot be parsed raises `CallError` out of the iterator)."""
        st = self.state
        try:
            async for req in requests:
                if isinstance(req, Text):
                    piece = req.text
                    if not piece:
                        continue
                    uid = self.session.utterance_id
                    if uid == st.open_ended:
                        continue  # belongs to the open-ended utterance: dropped
                    u = st.utt(uid)
                    if u.first_text_at is None:
                        u.first_text_at = time.perf_counter()
                    # characters, also of UTF-8 bytes split mid-character: one lead byte
                    # (any byte but a continuation, 0b10xxxxxx) per character
                    u.text_chars += len(piece) if isinstance(piece, str) else sum(
                        1 for b in piece if b & 0xC0 != 0x80)
                    u.has_speech = u.has_speech or bool(piece.strip())
                    self.session.push_text(piece)
                elif isinstance(req, Control):
                    self._control(req)
                elif isinstance(req, SessionConfig):
                    raise invalid("a second SessionConfig; send one per stream, first")
                else:
                    raise invalid(f"not a request: {type(req).__name__}")
            # Half-close means FLUSH, then end of stream.
            self._control(Control.FLUSH)
            st.queue.put_nowait(_EndOfInput())
        except CallError as e:
            st.queue.put_nowait(_Failed(e))
        except ValueError as e:  # engine's verdict on text: invalid UTF-8, over the limit
            st.queue.put_nowait(_Failed(invalid(str(e))))

    def _control(self, kind: Control) -> None:
        st = self.state
        if kind is Control.FLUSH:
            uid = self.session.utterance_id
            u = st.utterances.get(uid)
            has_text = u is not None and u.text_chars > 0
            if u is not None and u.has_speech:
                self.session.flush()
                st.queue.put_nowait(_Flush(uid, empty=False))
            else:
                # Nothing (or only whitespace) to speak: drop it and answer at once.
                if has_text:
                    self.session.cancel()
                else:
                    self.session.flush()  # closes an open-ended utterance; else a no-op
                st.queue.put_nowait(_Flush(uid, empty=True))
        else:  # STOP, RESET
            reset = kind is Control.RESET
            # Utterances not yet FLUSHED (speaking, queued here, or taking text): this
            # drops them all. Counted here: their ends may never reach the writer.
            live = [uid for uid in st.utterances if uid >= st.drop_below]
            self.metrics.utterances("cancelled").inc(len(live))
            if st.open_ended is not None and st.open_ended >= st.drop_below:
                live.append(st.open_ended)  # its end is counted (cap or EOS) and written
            if reset:
                self.session.reset(self.state.cfg.seed)
            else:
                self.session.cancel()
            st.drop_below = self.session.utterance_id
            st.flushes.clear()
            st.queue.put_nowait(_Stop(reset, max(live, default=st.drop_below)))

    # -- writer ------------------------------------------------------------------------
    async def write(self, first: Output | None = None) -> AsyncIterator[Output]:
        """The call's output (`first`, then frames and events), paced."""
        if first is not None:
            yield first
        st, inbox, out, loop = self.state, self.state.queue, self._out, self.loop
        pacer = self.pacer
        sent = 0
        try:
            while True:
                if self._aborted is not None:
                    raise self._aborted
                while inbox.items:  # in order; frames and events go to `out`
                    self._take(inbox.items.popleft())
                if not out:
                    if self._ending and not st.flushes:
                        return
                    if sent:
                        self.metrics.frames_sent.inc(sent)
                        sent = 0
                    await inbox.wait(None)
                    continue
                entry = out[0]
                uid = entry.utterance_id
                if isinstance(entry, AudioFrame):
                    if uid < st.drop_below:  # stopped while it waited
                        out.popleft()
                        st.pending_frames -= entry.frames
                        self._maybe_resume()
                        continue
                    idx = entry.index
                    # Kept until its end is written (else: nothing to pace against).
                    u = st.utterances.get(uid) or _Utterance()
                    wake = pacer.wake_at(u.t0, idx)
                    if wake is not None:  # not yet: sleep until it is
                        if sent:
                            self.metrics.frames_sent.inc(sent)
                            sent = 0
                        await inbox.wait(wake)
                        continue
                    out.popleft()
                    n = entry.frames
                    st.pending_frames -= n
                    if st.paused:
                        self._maybe_resume()
                    if idx == 0:
                        u.t0 = loop.time()
                        yield self._first_audio(uid, u)
                    entry.seq = seq = self.seq
                    self.seq = seq + n
                    sent += n
                    if sent >= 64:
                        self.metrics.frames_sent.inc(sent)
                        sent = 0
                    yield entry
                elif isinstance(entry, _End):
                    out.popleft()
                    if uid < st.drop_below:  # stopped: counted at its STOP / RESET
                        continue
                    self.metrics.utterances(entry.reason).inc()
                    st.utterances.pop(uid, None)
                    for kind in entry.kinds:
                        yield self._event(kind, uid)
                else:
                    out.popleft()
                    if entry.tied and uid < st.drop_below:
                        continue
                    yield self._event(entry.kind, uid)
        finally:
            if sent:
                self.metrics.frames_sent.inc(sent)

    def _take(self, item: Any) -> None:
        """One item off the queue, in order: state moves now, output goes to `_out`."""
        st = self.state
        if isinstance(item, AudioPacket):
            self._on_packet(item)
        elif isinstance(item, UtteranceEnd):
            self._on_end(item)
        elif isinstance(item, _Flush):
            uid = item.utterance_id
            if item.empty or uid == st.open_ended:
                tied = uid == st.open_ended  # after the open-ended utterance's audio
                if tied:  # its audio is all framed
                    st.open_ended = None
                self._out.append(_Event(uid, EventKind.FLUSHED, tied))
            elif uid >= st.drop_below:
                st.flushes.add(uid)
        elif isinstance(item, _Stop):
            for uid in [u for u in st.utterances if u < st.drop_below]:
                del st.utterances[uid]
            if st.open_ended is not None and st.open_ended < st.drop_below:
                st.open_ended = None
            # Everything of the dropped utterances still unwritten goes; STOPPED is next.
            drop = st.drop_below
            kept = [e for e in self._out
                    if e.utterance_id >= drop or (isinstance(e, _Event) and not e.tied)]
            st.pending_frames -= sum(e.frames for e in self._out
                                     if isinstance(e, AudioFrame) and e.utterance_id < drop)
            self._out.clear()
            self._out.extend(kept)
            self._maybe_resume()
            kind = EventKind.RESET if item.reset else EventKind.STOPPED
            self._out.append(_Event(item.utterance_id, kind, False))
        elif isinstance(item, _EndOfInput):
            self._ending = True
        elif isinstance(item, _Failed):
            raise item.error

    def _on_packet(self, p: AudioPacket) -> None:
        st = self.state
        st.backlog_samples -= p.pcm.size
        if p.utterance_id < st.drop_below:
            self._maybe_resume()
            return
        u = st.utt(p.utterance_id)
        if u.framer is None:
            u.framer = UtteranceFramer(self.codec.sample_rate, st.cfg.sample_rate,
                                       st.cfg.frame_ms)
        frames = [u.held] if u.held is not None else []
        before, before_chars = len(frames), u.held_chars
        u.held = None
        if p.final:  # the last packet: drain the resampler, pad, flag the last frame
            frames += u.framer.push(p.pcm, p.pcm16) + u.framer.finish()
            u.framer = None  # drained: UtteranceEnd has nothing left to flush
        else:
            frames += u.framer.push(p.pcm, p.pcm16)
            if frames:  # the packet's other frames go out now, this one with what follows
                u.held = frames.pop()
                if len(frames) >= before:  # it is this packet's
                    u.held_chars = p.text_chars
                else:
                    before = 0
        self._frames(p.utterance_id, u, frames, p.final, p.text_chars, before, before_chars)
        self._maybe_resume()

    def _on_end(self, e: UtteranceEnd) -> None:
        st = self.state
        uid = e.utterance_id
        if uid < st.drop_below:  # stopped: counted at its STOP / RESET
            st.utterances.pop(uid, None)
            return
        if e.reason in ("cancelled", "invalid", "error"):  # nothing more of it is written
            self.metrics.utterances(e.reason).inc()
            st.utterances.pop(uid, None)
            if e.reason == "invalid":  # this session's input: the call ends, no one else's
                raise invalid(e.error)
            if e.reason == "error":
                raise CallError("internal", f"synthesis failed: {e.error}; "
                                "see server logs")
            return
        u = st.utt(uid)
        frames = [u.held] if u.held is not None else []
        if u.framer is not None:
            frames += u.framer.finish()
            u.framer = None
        if frames:  # the last message says what the end says (all of the text, for eos)
            self._frames(uid, u, frames, True, e.text_chars, len(frames) - 1, u.held_chars)
        u.held = None
        kinds: list[EventKind] = []
        if e.reason == "max_frames":
            kinds.append(EventKind.TRUNCATED)
        if uid in st.flushes:
            st.flushes.discard(uid)
            kinds.append(EventKind.FLUSHED)
        else:
            # Ended before its FLUSH (the frame cap, or the model's EOS while text still
            # streams): open until that FLUSH, which it answers (see the proto).
            st.open_ended = uid
        # Counted and forgotten once its last frame is written (the writer).
        self._out.append(_End(uid, e.reason, tuple(kinds)))

    def close(self) -> None:
        """The call is over (done, failed, cancelled by the client, cut by the drain):
        utterances still in progress (or not all written) count as cancelled."""
        st = self.state
        live = [uid for uid in st.utterances if uid >= st.drop_below]
        self.metrics.utterances("cancelled").inc(len(live))
        st.utterances.clear()

    def _frames(self, uid: int, u: _Utterance, frames: list[bytes], last: bool,
                chars: int, before: int = 0, before_chars: int = 0) -> None:
        """One packet's frames into messages of up to `frames_per_message` (never held
        for the next packet: a message carries what is there). A message says the text
        its last frame had read: `chars`, or `before_chars` for the first `before` frames
        (made of an earlier packet's audio)."""
        n, k = len(frames), self._per_message
        out = self._out
        if k == 1:  # the contract's default: a frame a message, no slicing
            made = u.made
            for i, pcm in enumerate(frames):
                out.append(AudioFrame(uid, made + i, pcm, last and i == n - 1, 1,
                                      chars if i >= before else before_chars))
            u.made = made + n
            self.state.pending_frames += n
            return
        for i in range(0, n, k):
            chunk = frames[i:i + k]
            out.append(AudioFrame(uid, u.made, b"".join(chunk),
                                  last and i + k >= n, len(chunk),
                                  chars if i + len(chunk) > before else before_chars))
            u.made += len(chunk)
        self.state.pending_frames += n

    def _ttfa(self, uid: int, u: _Utterance, timings: dict | None) -> None:
        u.ttfa_s = time.perf_counter() - (u.first_text_at or time.perf_counter())
        u.timings = timings
        self.metrics.ttfa.observe(u.ttfa_s)
        self.ttfas_ms.append(round(u.ttfa_s * 1e3, 1))  # for the session's end line
        if log.isEnabledFor(logging.DEBUG):  # per utterance: not on the hot path at INFO
            log.debug("first audio session=%s trace=%s utterance=%d ttfa_ms=%.1f",
                      self.state.cfg.session_id, self.state.cfg.trace_id, uid,
                      u.ttfa_s * 1e3)

    def _first_audio(self, uid: int, u: _Utterance) -> FirstAudio:
        if u.ttfa_s is None:
            self._ttfa(uid, u, None)
        ttfa = u.ttfa_s or 0.0
        t = u.timings or {}
        return FirstAudio(uid, self.seq, Timings(
            ttfa_ms=ttfa * 1e3, queue_ms=float(t.get("queue_ms", 0.0)),
            prefill_ms=float(t.get("prefill_ms", 0.0)),
            first_packet_ms=float(t.get("first_packet_ms", 0.0)),
            text_chars=u.text_chars,
        ))

    def _event(self, kind: EventKind, uid: int) -> Event:
        return Event(kind, uid, self.seq)
