"""One synthesis call, whatever the protocol (`Synthesis.call`): admission, the
first-config rule, an engine session, the stream. gRPC `Synthesize` (`service.py`), the
OpenAI HTTP speech request (`openai_speech.py`) and the speech WebSocket (`ws_speech.py`)
are thin adapters over it: each turns its messages into the call's requests and its
output into its own messages (`messages.py`: the call's types; protobuf stays in the gRPC
adapter), and the one `CallError` a call can end with into its own status (`errors.py`
maps them all).

Admission (`admission.py`: open streams, the engine's real-time capacity; draining) and
the mapping of every failure to one status code happen here; the streaming rules are in
`stream.py`, pacing in `pacing.py`. The server (`server.py`) drains and fails the calls
through `hurry`, `cut_open_calls` and `fail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from voice_tts.engine import Engine, EngineFull, SessionParams, VoiceNames, VoicePrompt
from voice_tts.engine.engine_set import EngineSet
from voice_tts.engine.session import Sink
from voice_tts.server.admission.admission import (
    Admission,
    Rejected,
    Ticket,
    TrackedSession,
    frame_budget_ms,
)
from voice_tts.server.admission.capacity import FramePeriodModel, FrontModel
from voice_tts.server.call.messages import (
    Output,
    Request,
    ResolvedConfig,
    SessionConfig,
    SessionStarted,
    Text,
)
from voice_tts.server.call.protocol import resolve_config
from voice_tts.server.call.refusal import until_client_stops_writing
from voice_tts.server.call.stream import Codec, SynthesizeStream
from voice_tts.server.errors import CallError, VoiceError, invalid, status_for
from voice_tts.server.metrics import CallMetrics, TTSMetrics
from voice_tts.server.voices.voice_library import VoiceLibrary
from voice_tts.settings import TTSSettings

log = logging.getLogger("voice_tts.synthesis")
DRAINED = ("server drained: the call was still open when the drain timeout "
           "(TTS_DRAIN_TIMEOUT_S) ended; retry on another replica")


class Synthesis:
    """The synthesis calls of one server and what they share: the engine, admission,
    metrics, and the server's state (draining, failed)."""

    def __init__(self, engine: Engine | EngineSet, settings: TTSSettings,
                 metrics: TTSMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.draining = False
        self.active: set[asyncio.Task[Any]] = set()
        # Calls cut by the server (drain timeout, engine fault): their UNAVAILABLE message.
        self.cut: dict[asyncio.Task[Any], str] = {}
        self.streams: dict[asyncio.Task[Any], SynthesizeStream] = {}  # calls past config
        self.codec = Codec(engine.sample_rate, engine.frame_samples)
        self.failed: str | None = None  # the engine has stopped: every call is refused
        self.library: VoiceLibrary | None = None  # set by the server (inline reference audio)
        # Fed by the engine's steps (server.py's on_step -> `admission.model.observe`) and
        # this loop's CPU per open call.
        model = FramePeriodModel()
        front = FrontModel(open_streams=lambda: self.admission.open)
        codec_ms = 1e3 * self.codec.frame_s
        budget = frame_budget_ms(settings.admit_margin, settings.first_packet_frames,
                                 settings.packet_frames, codec_ms,
                                 settings.admit_frame_budget_ms)
        self.admission = Admission(model, settings.max_sessions, budget,
                                   settings.admit_idle_grace_s, codec_ms, front,
                                   settings.admit_margin)
        metrics.watch_admission(self.admission)

    @contextlib.asynccontextmanager
    async def call(self, protocol: str, requests: AsyncIterator[Request],
                   pace_lead_s: float | None = None
                   ) -> AsyncIterator[AsyncIterator[Output]]:
        """One synthesis call, whatever the protocol: admission, the first-message rule,
        an engine session, the stream. `requests` starts with the SessionConfig. Gives
        the call's output (the stream's own writer: no extra hop per frame);
        every failure, in here or while they are read, ends it with one `CallError`,
        which the protocol's front turns into its status, HTTP error or close code. Run
        it in the task that serves the call: a drain or an engine fault cuts that task."""
        task = asyncio.current_task()
        assert task is not None
        m = self.metrics.of(protocol)
        session = None
        ticket = None
        stream: SynthesizeStream | None = None
        reader: asyncio.Task[None] | None = None
        self._enter(task, m)
        t0, outcome = time.perf_counter(), "ok"
        try:
            it = requests.__aiter__()
            try:
                ticket = self._admit()  # decided at once, before the config
                stream, cfg = await self._open_stream(it, m, ticket, pace_lead_s)
            except Exception:
                if ticket is not None:  # its place is free while the client finishes
                    ticket.close()
                    ticket = None
                await until_client_stops_writing(it)
                raise
            session = stream.session
            self.streams[task] = stream
            if log.isEnabledFor(logging.DEBUG):  # one INFO line a session: at its end
                self._log_started(protocol, cfg)
            reader = asyncio.create_task(stream.read(it))
            responses = stream.write(SessionStarted(cfg))
            async with contextlib.aclosing(responses):
                yield responses
        except GeneratorExit:  # the protocol closed its response generator: the client left
            outcome = "client_cancelled"
            raise
        except asyncio.CancelledError:
            if task not in self.cut:
                outcome = "client_cancelled"
                raise
            outcome = "unavailable"
            # Cut by the server: tell the client why (else it sees CANCELLED at stop).
            raise self._cut_error(task, m) from None
        except Exception as e:  # every failure ends the call with one clear status
            error = self._failure(protocol, m, e)
            outcome = error.kind
            raise CallError(error.kind, error.message) from None
        finally:
            if reader is not None:
                reader.cancel()
            if stream is not None:
                stream.close()
                self._log_ended(protocol, stream, t0, outcome)
            if session is not None:
                session.close()  # frees the engine slot within one step
            if ticket is not None:
                ticket.close()
            self._leave(task, m)

    # --- the steps of a call, in its order ---------------------------------------------

    def _enter(self, task: asyncio.Task[Any], m: CallMetrics) -> None:
        """Count the call as open (the drain waits for it, a cut reaches it)."""
        self.active.add(task)
        m.requests.inc()
        m.active_sessions.inc()

    def _admit(self) -> Ticket:
        """The call's place, or its refusal: the engine failed, draining, or full."""
        if self.failed is not None:
            raise CallError("unavailable", self.failed)
        if self.draining:
            raise CallError("unavailable", "server is draining; retry on another "
                            "replica")
        return self.admission.admit()

    async def _open_stream(self, it: AsyncIterator[Request], m: CallMetrics, ticket: Ticket,
                           pace_lead_s: float | None
                           ) -> tuple[SynthesizeStream, ResolvedConfig]:
        """The first config, then the call's stream over an engine session in `ticket`."""
        cfg, inline = await self._first_config(it)
        lead = self.settings.pace_lead_s if pace_lead_s is None else pace_lead_s
        params = SessionParams(voice=cfg.voice, language=cfg.language,
                               instruct=cfg.instruct, seed=cfg.seed,
                               sampling=cfg.sampling,
                               max_text_chars=self.settings.max_text_chars,
                               max_frames=cfg.max_frames or None, voice_prompt=inline)

        def open_session(sink: Sink) -> TrackedSession:
            return TrackedSession(self.engine.open_session(
                params, sink=ticket.sink(sink)), ticket)

        stream = SynthesizeStream(cfg, open_session, m, self.codec,
                                  self.settings.max_backlog_s,
                                  0.0 if self.draining else lead)
        return stream, cfg

    @staticmethod
    def _log_started(protocol: str, cfg: ResolvedConfig) -> None:
        """The session's start, at DEBUG (its one INFO line comes at its end)."""
        log.debug("session started protocol=%s session=%s trace=%s voice=%s "
                  "rate=%d frame_ms=%d", protocol, cfg.session_id, cfg.trace_id,
                  cfg.voice, cfg.sample_rate, cfg.frame_ms)

    def _cut_error(self, task: asyncio.Task[Any], m: CallMetrics) -> CallError:
        """A call cut by the server (drain timeout, engine fault): UNAVAILABLE and why."""
        error = CallError("unavailable", self.cut[task])
        m.error(error.status.grpc.name).inc()
        return error

    @staticmethod
    def _failure(protocol: str, m: CallMetrics, e: Exception) -> CallError:
        """Any failure as its one status (counted; logged with its trace if internal)."""
        error = status_for(e)
        if error.kind == "internal":
            log.exception("synthesis call failed protocol=%s", protocol)
        m.error(error.status.grpc.name).inc()
        if isinstance(e, Rejected | EngineFull):
            m.rejected(e.reason if isinstance(e, Rejected) else "sessions").inc()
        return error

    @staticmethod
    def _log_ended(protocol: str, stream: SynthesizeStream, t0: float, outcome: str) -> None:
        """The session's one INFO line, at its end, with its numbers."""
        log.info("session ended protocol=%s session=%s trace=%s voice=%s "
                 "frames=%d ttfa_ms=%s seconds=%.2f end=%s", protocol,
                 stream.state.cfg.session_id, stream.state.cfg.trace_id,
                 stream.state.cfg.voice, stream.seq, stream.ttfas_ms,
                 time.perf_counter() - t0, outcome)

    def _leave(self, task: asyncio.Task[Any], m: CallMetrics) -> None:
        """Count the call as ended and forget it (the counterpart of `_enter`)."""
        m.active_sessions.dec()
        self.active.discard(task)
        self.cut.pop(task, None)
        self.streams.pop(task, None)

    def hurry(self) -> None:
        """Draining: open calls stop pacing, so in-flight utterances end in time."""
        for stream in self.streams.values():
            stream.hurry()

    def cut_open_calls(self, message: str = DRAINED) -> int:
        """Every call still open ends with UNAVAILABLE and `message` (each aborts itself
        when its cancellation lands in the handler): the drain timeout is over, or the
        engine has failed."""
        for task in self.active:
            if task in self.streams:  # its writer raises the status, ahead of its audio
                self.streams[task].abort(CallError("unavailable", message))
            else:
                self.cut[task] = message
                task.cancel()
        return len(self.active)

    def fail(self, message: str) -> int:
        """The engine stopped for good: refuse new calls, cut the open ones."""
        self.failed = message
        return self.cut_open_calls(message)

    async def _first_config(self, it: AsyncIterator[Request]
                            ) -> tuple[ResolvedConfig, VoicePrompt | None]:
        try:
            req = await asyncio.wait_for(anext(it), self.settings.config_timeout_s)
        except StopAsyncIteration:
            raise invalid("stream closed before a SessionConfig") from None
        except TimeoutError:
            raise invalid(f"no SessionConfig within {self.settings.config_timeout_s:g} s") \
                from None
        if not isinstance(req, SessionConfig):
            kind = "text" if isinstance(req, Text) else "control"
            raise invalid(f"the first message must be a SessionConfig, got {kind}")
        if req.reference is None:
            return resolve_config(req, self.engine.voice_table.names), None
        return await self._inline(req)

    async def _inline(self, config: SessionConfig) -> tuple[ResolvedConfig, VoicePrompt]:
        """A config with inline reference audio: its clone, for this session only (it is in
        no table), labelled `~inline-...` (a library name has no `~`)."""
        if config.voice:
            raise invalid("SessionConfig.voice and .reference are both set: name a voice "
                          "or send reference audio, not both")
        if self.library is None:
            raise CallError("unsupported", "inline reference audio needs the server's "
                            "voice library")
        r = config.reference
        assert r is not None
        try:
            prompt = await self.library.inline_prompt(r.audio, r.ref_text, r.x_vector_only)
        except VoiceError as e:  # for one request, too large is a bad request, not 429
            kind = "invalid" if e.kind in ("too_large", "storage") else e.kind
            raise CallError(kind, e.message) from None
        # Not echoed back in SESSION_STARTED: the reference; the voice is its label.
        cfg = dataclasses.replace(config, reference=None,
                                  voice=f"~inline-{uuid.uuid4().hex[:12]}")
        return resolve_config(cfg, VoiceNames([cfg.voice], self.engine.languages())), prompt
