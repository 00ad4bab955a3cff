"""`voice.tts.v1.TextToSpeech` over gRPC: a thin adapter over `Synthesis.call`, and the
voice library's CreateVoice / GetVoice / DeleteVoice (`voice_library.py`).

The only place the call meets protobuf: `Synthesize` requests are registered with an
identity deserializer and parsed here into the call's requests (`messages.py`), so
garbage bytes get INVALID_ARGUMENT with a message instead of grpc's generic error; the
call's output becomes `SynthesizeResponse`s, its one `CallError` the call's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError
from voice.tts.v1 import tts_pb2

from voice_tts.engine import UnknownVoice, Voice
from voice_tts.server.call import messages as m
from voice_tts.server.call.messages import AudioFrame, SessionStarted
from voice_tts.server.call.refusal import until_client_stops_writing
from voice_tts.server.call.synthesis import Synthesis
from voice_tts.server.errors import CallError, VoiceError, invalid
from voice_tts.server.voices.reference_audio import ReferenceAudio
from voice_tts.server.voices.voice_library import VoiceLibrary
from voice_tts.settings import SUPPORTED_FRAME_MS, SUPPORTED_RATES

SERVICE_NAME = "voice.tts.v1.TextToSpeech"


class TextToSpeechServicer:
    def __init__(self, synthesis: Synthesis, library: VoiceLibrary | None = None) -> None:
        self.synthesis = synthesis
        self.library = library

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Synthesize": grpc.stream_stream_rpc_method_handler(
                self.synthesize,
                request_deserializer=None,  # raw bytes: parsed in `parse_request`
                response_serializer=tts_pb2.SynthesizeResponse.SerializeToString,
            ),
            "ListVoices": grpc.unary_unary_rpc_method_handler(
                self.list_voices,
                request_deserializer=tts_pb2.ListVoicesRequest.FromString,
                response_serializer=tts_pb2.ListVoicesResponse.SerializeToString,
            ),
            **{name: grpc.unary_unary_rpc_method_handler(
                getattr(self, attr), request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString)
               for name, attr, req, resp in (
                   ("CreateVoice", "create_voice", tts_pb2.CreateVoiceRequest,
                    tts_pb2.CreateVoiceResponse),
                   ("GetVoice", "get_voice", tts_pb2.GetVoiceRequest,
                    tts_pb2.GetVoiceResponse),
                   ("DeleteVoice", "delete_voice", tts_pb2.DeleteVoiceRequest,
                    tts_pb2.DeleteVoiceResponse))},
        })

    def _voice(self, v: Voice) -> tts_pb2.Voice:
        out = tts_pb2.Voice(name=v.name, languages=list(v.languages), dialect=v.dialect or "",
                            kind=getattr(v, "kind", "preset"))
        stored = self.library.get(v.name) if self.library is not None else None
        if stored is not None:
            out.kind = stored.kind
            out.created_at, out.duration_s = stored.created_at, stored.duration_s
            out.ref_text, out.x_vector_only = stored.ref_text, stored.x_vector_only
            out.description = stored.description
            out.warnings.extend(stored.warnings)
        return out

    async def create_voice(self, request: tts_pb2.CreateVoiceRequest,
                           context: grpc.aio.ServicerContext) -> tts_pb2.CreateVoiceResponse:
        source = request.WhichOneof("source")
        try:
            lib = self._library()
            if source == "reference":
                r = request.reference
                stored = await lib.create_from_audio(request.name, reference_from_proto(r),
                                                     r.ref_text, r.x_vector_only,
                                                     request.consent)
            elif source == "description":
                stored = await lib.create_from_description(request.name, request.description)
            else:
                raise VoiceError("invalid", "CreateVoiceRequest needs a reference (audio) or "
                                 "a description")
        except VoiceError as e:
            await context.abort(e.status.grpc, e.message)
        return tts_pb2.CreateVoiceResponse(voice=self._voice(self._engine_voice(stored.name)))

    async def get_voice(self, request: tts_pb2.GetVoiceRequest,
                        context: grpc.aio.ServicerContext) -> tts_pb2.GetVoiceResponse:
        try:
            return tts_pb2.GetVoiceResponse(voice=self._voice(self._engine_voice(request.name)))
        except VoiceError as e:
            await context.abort(e.status.grpc, e.message)

    async def delete_voice(self, request: tts_pb2.DeleteVoiceRequest,
                           context: grpc.aio.ServicerContext) -> tts_pb2.DeleteVoiceResponse:
        try:
            await self._library().delete(request.name)
        except VoiceError as e:
            await context.abort(e.status.grpc, e.message)
        return tts_pb2.DeleteVoiceResponse()

    def _library(self) -> VoiceLibrary:
        if self.library is None:
            raise VoiceError("unsupported", "this server has no voice library")
        return self.library

    def _engine_voice(self, name: str) -> Voice:
        try:
            return self.synthesis.engine.voice_table.voice(name)
        except UnknownVoice:
            raise VoiceError("not_found", f"unknown voice {name[:64]!r}; ListVoices names "
                             "them") from None

    async def list_voices(self, request: tts_pb2.ListVoicesRequest,
                          context: grpc.aio.ServicerContext) -> tts_pb2.ListVoicesResponse:
        engine = self.synthesis.engine
        return tts_pb2.ListVoicesResponse(
            voices=[self._voice(v) for v in engine.voices()],
            languages=list(engine.languages()),
            model=engine.model_name,
            native_sample_rate=engine.sample_rate,
            sample_rates=list(SUPPORTED_RATES),
            frame_ms=list(SUPPORTED_FRAME_MS),
            max_text_chars=self.synthesis.settings.max_text_chars,
        )

    async def synthesize(self, requests: AsyncIterator[bytes],
                         context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """gRPC `Synthesize`: the call, its output as responses, its failure as the
        call's status."""
        try:
            async with self.synthesis.call("grpc", _parsed(requests)) as outputs:
                frame_ms, several = 0, False  # the session's (SESSION_STARTED comes first)
                async for out in outputs:
                    if type(out) is AudioFrame:  # the hot path: one message, no other hop
                        # fields set one by one: a third of the cost of keyword arguments
                        # (upb builds a nested message from kwargs slowly)
                        r = tts_pb2.SynthesizeResponse()
                        a = r.audio
                        a.seq = seq = out.seq
                        a.pcm = out.pcm
                        a.utterance_id = out.utterance_id
                        a.start_ms = seq * frame_ms
                        a.last_in_utterance = out.last_in_utterance
                        if several:
                            a.frames = out.frames
                        a.text_chars = out.text_chars
                        yield r
                        continue
                    if type(out) is SessionStarted:
                        frame_ms = out.config.frame_ms
                        several = out.config.frames_per_message > 1
                    yield response(out)
        except CallError as e:
            if e.status.grpc in CLIENT_ERRORS:
                # the client may still be writing: its status waits for the writes to
                # end, else a grpc.aio client reads INTERNAL (synthesis.py, grpc#36066)
                await until_client_stops_writing(requests)
            await context.abort(e.status.grpc, e.message)


# A call ended by the client's own mistake (its later messages are read and dropped).
CLIENT_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.UNIMPLEMENTED)


async def _parsed(raw: AsyncIterator[bytes]) -> AsyncIterator[m.Request]:
    """gRPC's requests, registered as raw bytes: parsed here, so that garbage gets
    INVALID_ARGUMENT with a message instead of grpc's generic error (once the client's
    writes end, read from the raw stream: this generator ends with its error)."""
    first = True
    async for b in raw:
        try:
            req = parse_request(b)
        except CallError:
            await until_client_stops_writing(raw)
            raise
        kind = req.WhichOneof("request")
        if first and kind != "config":
            raise invalid(f"the first message must be a SessionConfig, got {kind or 'empty'}")
        first = False
        if kind == "text":
            t = req.text
            yield m.Text(t.text if t.WhichOneof("piece") == "text" else t.utf8)
        elif kind == "control":
            yield _control(req.control.type)
        elif kind == "config":
            yield session_config(req.config)
        else:
            raise invalid("empty SynthesizeRequest; set config, text or control")


def parse_request(raw: bytes) -> tts_pb2.SynthesizeRequest:
    try:
        return tts_pb2.SynthesizeRequest.FromString(raw)
    except DecodeError as e:
        raise invalid(
            f"unparsable SynthesizeRequest ({e}); a string field must be valid UTF-8 - "
            "send raw bytes as TextDelta.utf8"
        ) from None


_CONTROLS = {tts_pb2.Control.FLUSH: m.Control.FLUSH, tts_pb2.Control.STOP: m.Control.STOP,
             tts_pb2.Control.RESET: m.Control.RESET}


def _control(kind: int) -> m.Control:
    try:
        return _CONTROLS[kind]
    except KeyError:
        raise invalid(f"unknown Control.type {kind}; use FLUSH, STOP or RESET") from None


_ENCODINGS = {tts_pb2.AUDIO_ENCODING_UNSPECIFIED: "",
              tts_pb2.AUDIO_ENCODING_PCM_S16LE: "pcm_s16le"}
_SAMPLING = ("greedy", "temperature", "top_k", "top_p", "repetition_penalty")


def session_config(c: tts_pb2.SessionConfig) -> m.SessionConfig:
    """The call's config from the proto's (validated by `protocol.resolve_config`)."""
    p = c.sampling
    sampling = m.Sampling(max_frames=p.max_frames, **{
        f: getattr(p, f) for f in _SAMPLING if p.HasField(f)})
    ref = None
    if c.HasField("reference"):
        ref = m.Reference(reference_from_proto(c.reference), c.reference.ref_text,
                          c.reference.x_vector_only)
    return m.SessionConfig(
        voice=c.voice, language=c.language, instruct=c.instruct,
        sample_rate=c.sample_rate, frame_ms=c.frame_ms,
        encoding=_ENCODINGS.get(c.encoding, str(c.encoding)),
        seed=c.seed if c.HasField("seed") else None, sampling=sampling,
        session_id=c.session_id, trace_id=c.trace_id,
        frames_per_message=c.frames_per_message, reference=ref)


def reference_from_proto(r: tts_pb2.ReferenceAudio) -> ReferenceAudio:
    """VoiceError "invalid" for a format number this server does not know (proto3 enums
    are open: any int32 arrives)."""
    try:
        fmt = tts_pb2.ReferenceAudio.Format.Name(r.format).removeprefix("FORMAT_").lower()
    except ValueError:
        known = ", ".join(f"{n} ({v})" for n, v in tts_pb2.ReferenceAudio.Format.items())
        raise VoiceError("invalid", f"unknown ReferenceAudio.format {r.format}; use one "
                         f"of {known}") from None
    return ReferenceAudio(r.audio, "wav" if fmt == "unspecified" else fmt, r.sample_rate,
                          r.channels or 1)


def config_proto(cfg: m.ResolvedConfig) -> tts_pb2.SessionConfig:
    """The resolved config as SESSION_STARTED carries it: every default filled in, the
    client's sampling as it sent it."""
    out = tts_pb2.SessionConfig(
        voice=cfg.voice, language=cfg.language, instruct=cfg.instruct,
        sample_rate=cfg.sample_rate, frame_ms=cfg.frame_ms,
        encoding=tts_pb2.AUDIO_ENCODING_PCM_S16LE, session_id=cfg.session_id,
        trace_id=cfg.trace_id, frames_per_message=cfg.frames_per_message)
    if cfg.seed is not None:
        out.seed = cfg.seed
    s = cfg.requested_sampling
    for f in _SAMPLING:
        if (v := getattr(s, f)) is not None:
            setattr(out.sampling, f, v)
    if s.max_frames:
        out.sampling.max_frames = s.max_frames
    return out


_EVENTS = {m.EventKind.FLUSHED: tts_pb2.Event.FLUSHED,
           m.EventKind.STOPPED: tts_pb2.Event.STOPPED,
           m.EventKind.RESET: tts_pb2.Event.RESET,
           m.EventKind.TRUNCATED: tts_pb2.Event.TRUNCATED}


def response(out: m.Output) -> tts_pb2.SynthesizeResponse:
    """An event of the call as gRPC sends it (frames: `synthesize`, inline)."""
    if isinstance(out, m.Event):
        e = tts_pb2.Event(type=_EVENTS[out.kind], utterance_id=out.utterance_id,
                          next_seq=out.next_seq)
    elif isinstance(out, m.FirstAudio):
        t = out.timings
        e = tts_pb2.Event(
            type=tts_pb2.Event.FIRST_AUDIO, utterance_id=out.utterance_id,
            next_seq=out.next_seq, timings=tts_pb2.ServerTimings(
                ttfa_ms=t.ttfa_ms, queue_ms=t.queue_ms, prefill_ms=t.prefill_ms,
                first_packet_ms=t.first_packet_ms, text_chars=t.text_chars))
    elif isinstance(out, SessionStarted):
        e = tts_pb2.Event(type=tts_pb2.Event.SESSION_STARTED, config=config_proto(out.config))
    else:
        raise TypeError(f"not an event: {type(out).__name__}")
    return tts_pb2.SynthesizeResponse(event=e)
