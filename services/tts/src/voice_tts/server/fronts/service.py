"""`voice.tts.v1.TextToSpeech` over gRPC: a thin adapter over `Synthesis.call`, and the
voice library's CreateVoice / GetVoice / DeleteVoice (`voice_library.py`).

`Synthesize` requests are registered with an identity deserializer and parsed here, so
garbage bytes get INVALID_ARGUMENT with a message instead of grpc's generic error; the
call's one `CallError` becomes the call's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from voice.tts.v1 import tts_pb2

from voice_tts.engine import UnknownVoice, Voice
from voice_tts.server.call.protocol import parse_request
from voice_tts.server.call.synthesis import Synthesis, until_client_stops_writing
from voice_tts.server.errors import CallError, VoiceError
from voice_tts.server.voices.reference_audio import reference_from_proto
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
                request_deserializer=None,  # raw bytes: parsed in protocol.parse_request
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
        """gRPC `Synthesize`: the call, its failure as the call's status."""
        try:
            async with self.synthesis.call("grpc", _parsed(requests)) as responses:
                async for resp in responses:
                    yield resp
        except CallError as e:
            if e.status.grpc in CLIENT_ERRORS:
                # the client may still be writing: its status waits for the writes to
                # end, else a grpc.aio client reads INTERNAL (synthesis.py, grpc#36066)
                await until_client_stops_writing(requests)
            await context.abort(e.status.grpc, e.message)


# A call ended by the client's own mistake (its later messages are read and dropped).
CLIENT_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.UNIMPLEMENTED)


async def _parsed(raw: AsyncIterator[bytes]) -> AsyncIterator[tts_pb2.SynthesizeRequest]:
    """gRPC's requests, registered as raw bytes: parsed here, so that garbage gets
    INVALID_ARGUMENT with a message instead of grpc's generic error (once the client's
    writes end, read from the raw stream: this generator ends with its error)."""
    async for b in raw:
        try:
            req = parse_request(b)
        except CallError:
            await until_client_stops_writing(raw)
            raise
        yield req
