"""livekit-agents TTS plugin for our TTS server (voice.tts.v1.TextToSpeech, gRPC bidi).

Shape of the framework's streaming plugins (livekit-plugins-cartesia): `TTS(tts.TTS)`
with `TTSCapabilities(streaming=True)`, a private `_TTSOptions`, and a
`SynthesizeStream` whose `_run` runs an input/send task and a receive task, joined
with gather and cancelled together; what they share is one `_Call` (fields, not
closures). One SynthesizeStream = one agent reply = one gRPC call:

- The SessionConfig goes out at once (the server session starts during the thinker's
  TTFT); the LLM text then goes through the bridge (`voice_agent.bridge`) and each
  segment is written as a TextDelta the moment it is cut. The framework's flush
  becomes Control FLUSH; end of input half-closes the call (server: FLUSH + end).
- Each AudioFrame's PCM is pushed to the framework's AudioEmitter as it arrives
  (raw PCM, re-framed by the framework's AudioByteStream at `frame_ms`).
- Each AudioFrame's `text_chars` (what of its utterance's text the TTS model had read)
  goes into `SynthesizeStream.text_progress`, a timeline of (audio seconds pushed so far,
  characters of the stream's input text read): `chars_at(audio_s)` bounds from above
  what a listener had heard by then (to cut a reply's transcript at a barge-in).
- `stop()` is the barge-in path: Control STOP goes out, and nothing received after
  it is pushed. Cancelling the stream cancels the call (the server frees its slot).
- Writing stops the moment the call ends (a done callback cancels the writers as the
  status is set): gRPC asyncio reports a write that races the end of the call as
  INTERNAL, over the server's status (grpc/grpc#36066). The receive side raises the
  server's status.

Works in anyone's AgentSession; the optional `tracker` only adds our per-turn timings.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass, field, replace

import grpc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectOptions,
    tts,
    utils,
)
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from ..bridge import BridgeConfig, TextSegmenter
from ..metrics import TurnTracker
from ._grpc import ChannelCache, status_error, to_api_error

log = logging.getLogger("voice_agent.tts")

_FLUSH = tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.FLUSH))
_STOP = tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.STOP))
# AudioFrame messages of up to this many frame_ms frames (SessionConfig.frames_per_message).
FRAMES_PER_MESSAGE = 4
# How long the TTS's answer to "is this voice an in-context clone" is kept (a voice can be
# deleted and made again as another kind under the same name).
VOICE_KIND_TTL_S = 30.0


@dataclass
class _TTSOptions:
    addr: str
    voice: str
    language: str
    sample_rate: int
    frame_ms: int
    seed: int | None
    max_frames: int = 0
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    flush_on_sentence: bool = False


class TTS(tts.TTS):
    def __init__(
        self,
        *,
        addr: str = "localhost:50051",
        voice: str = "serena",
        language: str = "auto",
        sample_rate: int = 24000,
        frame_ms: int = 20,
        seed: int | None = None,
        max_frames: int = 0,
        bridge: BridgeConfig | None = None,
        flush_on_sentence: bool = False,
        tracker: TurnTracker | None = None,
        api_key: str = "",
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._opts = _TTSOptions(
            addr=addr, voice=voice, language=language, sample_rate=sample_rate,
            frame_ms=frame_ms, seed=seed, max_frames=max_frames, bridge=bridge or BridgeConfig(),
            flush_on_sentence=flush_on_sentence,
        )
        # the TTS's API key (its TTS_API_KEYS) rides on every call; none when it is open
        self._channels = ChannelCache(addr, api_key)
        self._tracker = tracker
        self._streams: weakref.WeakSet[SynthesizeStream] = weakref.WeakSet()
        self._in_context: dict[str, tuple[float, bool]] = {}  # voice -> (when, in context)

    @property
    def model(self) -> str:
        return "voice.tts.v1"

    @property
    def provider(self) -> str:
        return self._opts.addr

    def update_options(self, *, voice: str | None = None, language: str | None = None) -> None:
        self._opts = replace(
            self._opts, voice=voice or self._opts.voice, language=language or self._opts.language
        )

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        s = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(s)
        return s

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stop_all(self) -> int:
        """Barge-in: STOP every running stream of this TTS; returns how many."""
        n = 0
        for s in list(self._streams):
            if s.stop():
                n += 1
        return n

    async def aclose(self) -> None:
        await self._channels.aclose()

    async def flushes_sentences(self, voice: str) -> bool:
        """Whether a reply in `voice` is flushed at each sentence end: when asked to, and
        always for an in-context clone (a library voice made with a transcript): its first
        frame waits for about as many text tokens as its reference has frames, or for a
        flush (services/tts/README.md, "How fast a clone speaks"), so without a flush a
        reply would start at its end. From the TTS's ListVoices, kept VOICE_KIND_TTL_S;
        a TTS that does not answer: no."""
        if self._opts.flush_on_sentence:
            return True
        key, now = voice.lower(), time.monotonic()
        seen = self._in_context.get(key)
        if seen is not None and now - seen[0] < VOICE_KIND_TTL_S:
            return seen[1]
        try:
            resp = await tts_pb2_grpc.TextToSpeechStub(self._channels.get()).ListVoices(
                tts_pb2.ListVoicesRequest(), timeout=2.0, metadata=self._channels.metadata)
        except (grpc.aio.AioRpcError, TimeoutError) as e:  # asked again after the TTL
            log.debug("tts ListVoices failed (%s): no flush per sentence", e)
            self._in_context[key] = (now, False)
            return False
        for v in resp.voices:
            self._in_context[v.name.lower()] = (now, v.kind == "clone" and not v.x_vector_only
                                                and bool(v.ref_text.strip()))
        return self._in_context.setdefault(key, (now, False))[1]

    def _config(self, trace_id: str) -> tts_pb2.SynthesizeRequest:
        o = self._opts
        cfg = tts_pb2.SessionConfig(
            voice=o.voice, language=o.language, sample_rate=o.sample_rate, frame_ms=o.frame_ms,
            encoding=tts_pb2.AUDIO_ENCODING_PCM_S16LE, trace_id=trace_id,
            # The emitter re-frames the PCM: an 80 ms codec frame in one message costs no
            # latency and a quarter of the server's messages (bench/README).
            frames_per_message=FRAMES_PER_MESSAGE,
        )
        if o.seed is not None:
            cfg.seed = o.seed
        if o.max_frames:
            cfg.sampling.max_frames = o.max_frames
        return tts_pb2.SynthesizeRequest(config=cfg)


@dataclass
class _Call:
    """One Synthesize call of a `SynthesizeStream._run`: what its input task and its
    receive task share (a retried run starts a new one)."""

    rpc: grpc.aio.StreamStreamCall
    request_id: str
    trace_id: str
    emitter: tts.AudioEmitter
    # SESSION_STARTED: the server accepted the config (text waits for it)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    # the first write that failed locally; the receive side then reads the real status
    write_failed: BaseException | None = None
    flush_on_sentence: bool = False  # FLUSH at each sentence end (TTS.flushes_sentences)
    utterance: int = 0  # server utterance id of the text being sent
    utterance_has_text: bool = False  # text written since the last FLUSH
    segment_has_text: bool = False  # text written since the framework's last flush
    # the server utterance ids that end a framework segment (FLUSHED may come out of
    # order: an empty utterance is answered at once)
    boundaries: set[int] = field(default_factory=set)
    segment_open: bool = False  # an emitter segment is open (receive side)
    segments_opened: int = 0  # emitter segments opened so far: the next one's id
    chars_sent: int = 0  # characters of text written so far
    # server utterance id -> characters written before its text (AudioFrame.text_chars
    # counts from its utterance's start)
    utterance_base: dict[int, int] = field(default_factory=dict)


class SynthesizeStream(tts.SynthesizeStream):
    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self._call: grpc.aio.StreamStreamCall | None = None
        self._write_lock = asyncio.Lock()
        self._stopped = False
        self._stop_task: asyncio.Future[None] | None = None
        self.segments: list[str] = []  # what the bridge sent, for tests and logs
        # (audio seconds pushed so far, characters of the input text the TTS model had
        # read when it made that audio's end), one entry per AudioFrame message, both
        # non-decreasing; empty from a TTS that does not report it (text_chars 0).
        # Characters are Unicode code points of the text pushed into this stream (the
        # bridge's segments are exact slices of it: "".join(self.segments)).
        self.text_progress: list[tuple[float, int]] = []
        self._audio_s = 0.0

    def chars_at(self, audio_s: float) -> int | None:
        """Characters of the input text the TTS had read when it made the audio playing at
        `audio_s` seconds into this stream's output: an upper bound on what a listener
        heard by then (the audio lags the text read by a few 80 ms frames). Past the end,
        the last value; None when the TTS reported nothing (an older server)."""
        tp = self.text_progress
        if not tp:
            return None
        i = bisect.bisect_left(tp, audio_s, key=lambda e: e[0])
        return tp[min(i, len(tp) - 1)][1]

    def stop(self) -> bool:
        """Barge-in: send Control STOP and push nothing more. True if a call was live."""
        if self._stopped:
            return False
        self._stopped = True
        call = self._call
        if call is None or call.done():
            return False
        self._stop_task = asyncio.ensure_future(self._send_stop(call))
        return True

    async def _send_stop(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async with self._write_lock:
                await call.write(_STOP)
        except Exception:  # the call may be gone already: nothing left to stop
            pass

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        opts = self._tts._opts
        tracker = self._tts._tracker
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id, sample_rate=opts.sample_rate, num_channels=1,
            mime_type="audio/pcm", frame_size_ms=opts.frame_ms, stream=True,
        )
        trace_id = tracker.ensure_turn().trace_id if tracker else request_id
        stub = tts_pb2_grpc.TextToSpeechStub(self._tts._channels.get())
        rpc = stub.Synthesize(wait_for_ready=False, metadata=self._tts._channels.metadata)
        self._call = rpc
        call = _Call(rpc=rpc, request_id=request_id, trace_id=trace_id, emitter=output_emitter)
        recv = asyncio.create_task(self._recv_task(call), name="tts.recv")
        inp = asyncio.create_task(self._input_task(call, recv), name="tts.input")
        tasks = [inp, recv]

        def _stop_writing(_: object) -> None:
            # Runs as the status is set, before a write in flight can fail and overwrite
            # it with INTERNAL (grpc/grpc#36066).
            inp.cancel()
            if self._stop_task is not None:
                self._stop_task.cancel()

        rpc.add_done_callback(_stop_writing)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if inp.done() and not inp.cancelled() and inp.exception() is not None:
                raise inp.exception()  # type: ignore[misc]
            await recv  # the call's outcome: the server's status if it failed
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            # The receive side's AioRpcError carries the status the server ended with
            # (`call.code()` may since have been overwritten by a failed write).
            code, details = grpc.StatusCode.UNAVAILABLE, str(e)
            if isinstance(e, grpc.aio.AioRpcError):
                code, details = e.code(), e.details()
            if tracker is not None:
                tracker.error("tts", f"{code.name}: {details}")
            raise status_error(code, details, "tts Synthesize") from None
        finally:
            await utils.aio.gracefully_cancel(*tasks)
            rpc.cancel()
            self._call = None

    async def _write(self, call: _Call, req: tts_pb2.SynthesizeRequest) -> None:
        # A write that races the server ending the call fails with a local error
        # (INTERNAL / "already finished"); the receive side then reads the real
        # status, so a failed write only stops the writing.
        if call.write_failed is not None or call.rpc.done():
            return
        try:
            async with self._write_lock:
                await call.rpc.write(req)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            call.write_failed = e

    async def _input_task(self, call: _Call, recv: asyncio.Task[None]) -> None:
        opts = self._tts._opts
        await self._write(call, self._tts._config(call.trace_id))
        # Text waits for SESSION_STARTED (one round trip, spent during the thinker's
        # TTFT): text written while the server rejects the config races its abort,
        # and the client then sees INTERNAL instead of the server's reason.
        waiter = asyncio.ensure_future(call.started.wait())
        await asyncio.wait([waiter, recv], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not call.started.is_set():
            return
        call.flush_on_sentence = await self._tts.flushes_sentences(opts.voice)
        segmenter = TextSegmenter(opts.bridge, flushes=call.flush_on_sentence)
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                for seg in segmenter.finish():
                    await self._send_text(call, seg.text, True)
                if not self._stopped:
                    await self._end_segment(call)
                continue
            for seg in segmenter.push(data):
                await self._send_text(call, seg.text, seg.ends_sentence)
        if call.write_failed is None and not call.rpc.done():
            async with self._write_lock:
                await call.rpc.done_writing()
        log.debug("tts input done trace_id=%s segments=%s stats=%s", call.trace_id,
                  len(self.segments), segmenter.stats)

    async def _send_text(self, call: _Call, text: str, ends_sentence: bool) -> None:
        if self._stopped or not text:
            return
        if self._tts._tracker is not None:
            self._tts._tracker.tts_text_sent()
        self._mark_started()
        self.segments.append(text)
        call.utterance_base.setdefault(call.utterance, call.chars_sent)
        call.chars_sent += len(text)
        await self._write(call, tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=text)))
        call.utterance_has_text = call.segment_has_text = True
        if call.flush_on_sentence and ends_sentence:
            await self._write(call, _FLUSH)
            call.utterance, call.utterance_has_text = call.utterance + 1, False

    async def _end_segment(self, call: _Call) -> None:
        """The framework's flush: FLUSH the text since the last one, and remember which
        server utterance ends this framework segment."""
        if call.utterance_has_text:
            await self._write(call, _FLUSH)
            call.utterance, call.utterance_has_text = call.utterance + 1, False
        if call.segment_has_text:
            call.boundaries.add(call.utterance - 1)
            call.segment_has_text = False

    async def _recv_task(self, call: _Call) -> None:
        tracker = self._tts._tracker
        rate = self._tts._opts.sample_rate
        async for resp in call.rpc:
            kind = resp.WhichOneof("response")
            if kind == "audio":
                if self._stopped:
                    continue  # barge-in: nothing after the decision reaches the output
                if not call.segment_open:
                    call.emitter.start_segment(
                        segment_id=f"{call.request_id}-{call.segments_opened}")
                    call.segment_open = True
                    call.segments_opened += 1
                if tracker is not None:
                    tracker.tts_audio_received()
                audio = resp.audio
                call.emitter.push(audio.pcm)
                self._audio_s += len(audio.pcm) / (2 * rate)
                if audio.text_chars:
                    self.text_progress.append((self._audio_s, audio.text_chars + (
                        call.utterance_base.get(audio.utterance_id, 0))))
                continue
            self._on_event(call, resp.event)
        if call.segment_open and not self._stopped:
            call.emitter.end_segment()
        if call.write_failed is not None and not self._stopped:
            raise status_error(grpc.StatusCode.UNAVAILABLE, str(call.write_failed),
                               "tts Synthesize (write)")

    def _on_event(self, call: _Call, ev: tts_pb2.Event) -> None:
        if ev.type == tts_pb2.Event.SESSION_STARTED:
            call.started.set()
        elif ev.type == tts_pb2.Event.FIRST_AUDIO:
            log.debug("tts first audio trace_id=%s utt=%d server_ttfa_ms=%.1f",
                      call.trace_id, ev.utterance_id, ev.timings.ttfa_ms)
        elif ev.type == tts_pb2.Event.FLUSHED:
            if ev.utterance_id in call.boundaries:
                call.boundaries.discard(ev.utterance_id)
                if call.segment_open:
                    call.emitter.end_segment()
                    call.segment_open = False
        elif ev.type == tts_pb2.Event.STOPPED:
            log.info("tts stopped trace_id=%s utt=%d", call.trace_id, ev.utterance_id)


class ChunkedStream(tts.ChunkedStream):
    """Whole-text synthesis (`TTS.synthesize`): one call, text, half-close, all audio."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        opts = self._tts._opts
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id, sample_rate=opts.sample_rate, num_channels=1,
            mime_type="audio/pcm", frame_size_ms=opts.frame_ms,
        )
        stub = tts_pb2_grpc.TextToSpeechStub(self._tts._channels.get())
        call = stub.Synthesize(metadata=self._tts._channels.metadata)

        async def write() -> None:
            for req in (self._tts._config(request_id),
                        tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=self._input_text))):
                if call.done():
                    return
                await call.write(req)
            await call.done_writing()

        writer = asyncio.create_task(write(), name="tts.chunked.write")
        call.add_done_callback(lambda _: writer.cancel())  # see SynthesizeStream._run
        try:
            async for resp in call:
                if resp.WhichOneof("response") == "audio":
                    output_emitter.push(resp.audio.pcm)
        except grpc.aio.AioRpcError as e:
            raise to_api_error(e, "tts Synthesize") from None
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError,
                                     asyncio.InvalidStateError, grpc.aio.UsageError):
                await writer
            call.cancel()
