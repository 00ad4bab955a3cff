"""`voice.tts.v1.TextToSpeech` over gRPC: a thin adapter over `Synthesis.call`.

`Synthesize` requests are registered with an identity deserializer and parsed here, so
garbage bytes get INVALID_ARGUMENT with a message instead of grpc's generic error; the
call's one `CallError` becomes the call's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from voice.tts.v1 import tts_pb2

from voice_tts.server.protocol import CallError, parse_request
from voice_tts.server.synthesis import Synthesis, until_client_stops_writing
from voice_tts.settings import SUPPORTED_FRAME_MS, SUPPORTED_RATES

SERVICE_NAME = "voice.tts.v1.TextToSpeech"


class TextToSpeechServicer:
    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis

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
        })

    async def list_voices(self, request: tts_pb2.ListVoicesRequest,
                          context: grpc.aio.ServicerContext) -> tts_pb2.ListVoicesResponse:
        engine = self.synthesis.engine
        return tts_pb2.ListVoicesResponse(
            voices=[tts_pb2.Voice(name=v.name, languages=list(v.languages),
                                  dialect=v.dialect or "") for v in engine.voices()],
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
            if e.code in CLIENT_ERRORS:
                # the client may still be writing: its status waits for the writes to
                # end, else a grpc.aio client reads INTERNAL (synthesis.py, grpc#36066)
                await until_client_stops_writing(requests)
            await context.abort(e.code, e.message)


# A call ended by the client's own mistake (its later messages are read and dropped).
CLIENT_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


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
