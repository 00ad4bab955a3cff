"""One `Synthesize` call: requests are read in one task while frames are written.

Three producers feed one ordered queue that the writer drains:
- the engine thread (through `sink`): `AudioPacket`, `UtteranceEnd`;
- the reader task: markers for FLUSH / STOP / RESET / end of input / errors.
Order in the queue is the order on the wire, with one exception that makes barge-in
immediate: STOP and RESET move `drop_below` forward *synchronously*, so every frame of an
older utterance still queued (or half framed) is dropped before the STOPPED event goes
out, and nothing of it is written after.

This module knows the protocol's streaming rules; validation is in `protocol.py`, frame
cutting in `framing.py`, the engine behind the `Session` API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from voice.tts.v1 import tts_pb2

from voice_tts.engine import AudioPacket, UtteranceEnd
from voice_tts.server.framing import NATIVE_RATE, UtteranceFramer
from voice_tts.server.metrics import TTSMetrics
from voice_tts.server.protocol import CallError, ResolvedConfig, invalid, parse_request

log = logging.getLogger("voice_tts.stream")


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
    frames: int = 0
    first_sent: bool = False


@dataclass
class StreamState:
    cfg: ResolvedConfig
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    drop_below: int = 0            # utterances below this id are dropped (STOP/RESET)
    utterances: dict[int, _Utterance] = field(default_factory=dict)
    flushes: set[int] = field(default_factory=set)  # utterance ids awaiting FLUSHED
    truncated: int | None = None   # ended by the frame cap before its FLUSH came
    backlog_samples: int = 0       # engine audio queued but not yet framed
    paused: bool = False

    def utt(self, uid: int) -> _Utterance:
        return self.utterances.setdefault(uid, _Utterance())


class SynthesizeStream:
    def __init__(self, cfg: ResolvedConfig, session: Any, metrics: TTSMetrics,
                 max_backlog_s: float) -> None:
        self.state = StreamState(cfg)
        self.session = session
        self.metrics = metrics
        self.max_backlog = int(max_backlog_s * NATIVE_RATE)
        self.seq = 0
        self.loop = asyncio.get_running_loop()
        self._ending = False
        self._aborted: CallError | None = None

    def abort(self, error: CallError) -> None:
        """End the call with `error` at the writer's next turn, ahead of queued audio (the
        server cuts it: drain timeout, engine fault)."""
        self._aborted = error
        self.state.queue.put_nowait(_Failed(error))

    # -- engine thread side ------------------------------------------------------------
    def sink(self, item: AudioPacket | UtteranceEnd) -> None:
        """Called by the engine thread; hands the item to the event loop."""
        # A closed loop means the call is gone: nothing to deliver to.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._enqueue_engine, item)

    def _enqueue_engine(self, item: AudioPacket | UtteranceEnd) -> None:
        st = self.state
        if isinstance(item, AudioPacket):
            st.backlog_samples += item.pcm.size
            # Flow control: a reader that falls behind pauses its own session in the
            # engine instead of growing this queue without bound.
            if st.backlog_samples > self.max_backlog and not st.paused:
                st.paused = True
                self.metrics.flow_pauses.inc()
                self.session.pause()
        st.queue.put_nowait(item)

    # -- reader ------------------------------------------------------------------------
    async def read(self, requests: AsyncIterator[bytes]) -> None:
        st = self.state
        try:
            async for raw in requests:
                req = parse_request(raw)
                kind = req.WhichOneof("request")
                if kind == "text":
                    piece = req.text.text if req.text.WhichOneof("piece") == "text" \
                        else req.text.utf8
                    if not piece:
                        continue
                    uid = self.session.utterance_id
                    if uid == st.truncated:
                        continue  # belongs to the truncated utterance: dropped
                    u = st.utt(uid)
                    if u.first_text_at is None:
                        u.first_text_at = time.perf_counter()
                    u.text_chars += len(piece)
                    u.has_speech = u.has_speech or bool(piece.strip())
                    self.session.push_text(piece)
                elif kind == "control":
                    self._control(req.control.type)
                elif kind == "config":
                    raise invalid("a second SessionConfig; send one per stream, first")
                else:
                    raise invalid("empty SynthesizeRequest; set config, text or control")
            # Half-close means FLUSH, then end of stream.
            self._control(tts_pb2.Control.FLUSH)
            st.queue.put_nowait(_EndOfInput())
        except CallError as e:
            st.queue.put_nowait(_Failed(e))
        except ValueError as e:  # engine's verdict on text: invalid UTF-8, over the limit
            st.queue.put_nowait(_Failed(invalid(str(e))))

    def _control(self, kind: int) -> None:
        st = self.state
        if kind == tts_pb2.Control.FLUSH:
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
                    self.session.flush()  # closes a truncated utterance; else a no-op
                st.queue.put_nowait(_Flush(uid, empty=True))
        elif kind in (tts_pb2.Control.STOP, tts_pb2.Control.RESET):
            reset = kind == tts_pb2.Control.RESET
            # Utterances not yet FLUSHED (speaking, queued here, or taking text): this
            # drops them all. Counted here: their ends may never reach the writer.
            live = [uid for uid in st.utterances if uid >= st.drop_below]
            self.metrics.utterances.labels("cancelled").inc(len(live))
            if st.truncated is not None and st.truncated >= st.drop_below:
                live.append(st.truncated)  # its end is counted (max_frames) and written
            if reset:
                self.session.reset(self.state.cfg.seed)
            else:
                self.session.cancel()
            st.drop_below = self.session.utterance_id
            st.flushes.clear()
            st.queue.put_nowait(_Stop(reset, max(live, default=st.drop_below)))
        else:
            raise invalid(f"unknown Control.type {kind}; use FLUSH, STOP or RESET")

    # -- writer ------------------------------------------------------------------------
    async def write(self) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        st = self.state
        while True:
            item = await st.queue.get()
            if self._aborted is not None:
                raise self._aborted
            if isinstance(item, AudioPacket):
                for resp in self._on_packet(item):
                    yield resp
            elif isinstance(item, UtteranceEnd):
                for resp in self._on_end(item):
                    yield resp
            elif isinstance(item, _Flush):
                if item.empty or item.utterance_id == st.truncated:
                    if item.utterance_id == st.truncated:  # its audio is all out
                        st.truncated = None
                    yield self._event(tts_pb2.Event.FLUSHED, item.utterance_id)
                elif item.utterance_id >= st.drop_below:
                    st.flushes.add(item.utterance_id)
            elif isinstance(item, _Stop):
                for uid in [u for u in st.utterances if u < st.drop_below]:
                    del st.utterances[uid]
                if st.truncated is not None and st.truncated < st.drop_below:
                    st.truncated = None
                kind = tts_pb2.Event.RESET if item.reset else tts_pb2.Event.STOPPED
                yield self._event(kind, item.utterance_id)
            elif isinstance(item, _EndOfInput):
                self._ending = True
            elif isinstance(item, _Failed):
                raise item.error
            if self._ending and not st.flushes:
                return

    def _on_packet(self, p: AudioPacket) -> list[tts_pb2.SynthesizeResponse]:
        st = self.state
        st.backlog_samples -= p.pcm.size
        if st.paused and st.backlog_samples < self.max_backlog // 2:
            st.paused = False
            self.session.resume()
        if p.utterance_id < st.drop_below:
            return []
        u = st.utt(p.utterance_id)
        if u.framer is None:
            u.framer = UtteranceFramer(st.cfg.sample_rate, st.cfg.frame_ms)
        if p.final:  # the last packet: drain the resampler, pad, flag the last frame
            frames = u.framer.push(p.pcm) + u.framer.finish()
            u.framer = None  # drained: UtteranceEnd has nothing left to flush
        else:
            frames = u.framer.push(p.pcm)
        return self._frames(p.utterance_id, u, frames, timings=p.timings, last=p.final)

    def _on_end(self, e: UtteranceEnd) -> list[tts_pb2.SynthesizeResponse]:
        st = self.state
        if e.utterance_id < st.drop_below:  # stopped: counted at its STOP / RESET
            st.utterances.pop(e.utterance_id, None)
            return []
        self.metrics.utterances.labels(e.reason).inc()
        if e.reason == "cancelled":
            st.utterances.pop(e.utterance_id, None)
            return []
        if e.reason == "invalid":  # this session's input: the call ends, no one else's
            raise invalid(e.error)
        if e.reason == "error":
            raise CallError(grpc.StatusCode.INTERNAL, f"synthesis failed: {e.error}; see "
                            "server logs")
        u = st.utt(e.utterance_id)
        out: list[tts_pb2.SynthesizeResponse] = []
        if u.framer is not None:
            out = self._frames(e.utterance_id, u, u.framer.finish(), timings=None, last=True)
        if u.first_text_at is not None and e.frames > 0:
            audio_s = e.frames * 1920 / NATIVE_RATE
            self.metrics.rtf.observe((time.perf_counter() - u.first_text_at) / audio_s)
        if e.reason == "max_frames":
            out.append(self._event(tts_pb2.Event.TRUNCATED, e.utterance_id))
            if e.utterance_id not in st.flushes:
                st.truncated = e.utterance_id  # open until its FLUSH (see the proto)
        if e.utterance_id in st.flushes:
            st.flushes.discard(e.utterance_id)
            out.append(self._event(tts_pb2.Event.FLUSHED, e.utterance_id))
        st.utterances.pop(e.utterance_id, None)
        return out

    def close(self) -> None:
        """The call is over (done, failed, cancelled by the client, cut by the drain):
        utterances still in progress count as cancelled."""
        st = self.state
        live = [uid for uid in st.utterances if uid >= st.drop_below]
        self.metrics.utterances.labels("cancelled").inc(len(live))
        st.utterances.clear()

    def _frames(self, uid: int, u: _Utterance, frames: list[bytes], timings: dict | None,
                last: bool = False) -> list[tts_pb2.SynthesizeResponse]:
        out: list[tts_pb2.SynthesizeResponse] = []
        for i, pcm in enumerate(frames):
            if not u.first_sent:
                u.first_sent = True
                out.append(self._first_audio(uid, u, timings))
            out.append(tts_pb2.SynthesizeResponse(audio=tts_pb2.AudioFrame(
                seq=self.seq, pcm=pcm, utterance_id=uid,
                start_ms=self.seq * self.state.cfg.frame_ms,
                last_in_utterance=last and i == len(frames) - 1,
            )))
            self.seq += 1
            u.frames += 1
        self.metrics.frames_sent.inc(len(frames))
        return out

    def _first_audio(self, uid: int, u: _Utterance,
                     timings: dict | None) -> tts_pb2.SynthesizeResponse:
        ttfa = time.perf_counter() - (u.first_text_at or time.perf_counter())
        self.metrics.ttfa.observe(ttfa)
        t = timings or {}
        log.info("first audio session=%s trace=%s utterance=%d ttfa_ms=%.1f",
                 self.state.cfg.session_id, self.state.cfg.trace_id, uid, ttfa * 1e3)
        return tts_pb2.SynthesizeResponse(event=tts_pb2.Event(
            type=tts_pb2.Event.FIRST_AUDIO, utterance_id=uid, next_seq=self.seq,
            timings=tts_pb2.ServerTimings(
                ttfa_ms=ttfa * 1e3, queue_ms=float(t.get("queue_ms", 0.0)),
                prefill_ms=float(t.get("prefill_ms", 0.0)),
                first_packet_ms=float(t.get("first_packet_ms", 0.0)),
                text_chars=u.text_chars,
            ),
        ))

    def _event(self, kind: int, uid: int) -> tts_pb2.SynthesizeResponse:
        return tts_pb2.SynthesizeResponse(
            event=tts_pb2.Event(type=kind, utterance_id=uid, next_seq=self.seq)
        )

