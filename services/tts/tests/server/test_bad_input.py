"""Every bad input ends the call with the right status and a clear message, and the
server keeps serving."""

from __future__ import annotations

import grpc
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import config

METHOD = "/voice.tts.v1.TextToSpeech/Synthesize"


async def call_with(addr: str, reqs: list[bytes]) -> tuple[grpc.StatusCode, str, list]:
    """Sends raw request bytes (so garbage can be sent too); returns status + responses."""
    async with grpc.aio.insecure_channel(addr) as ch:
        call = ch.stream_stream(METHOD, request_serializer=None,
                                response_deserializer=tts_pb2.SynthesizeResponse.FromString)()
        got = []
        try:
            for r in reqs:
                await call.write(r)
            await call.done_writing()
            async for resp in call:
                got.append(resp)
        except grpc.aio.AioRpcError:
            pass
        code = await call.code()
        return code, await call.details() or "", got


def cfg_bytes(**kw: object) -> bytes:
    return tts_pb2.SynthesizeRequest(config=config(**kw)).SerializeToString()


def text_bytes(t: str) -> bytes:
    return tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=t)).SerializeToString()


CASES = {
    "text before config": ([text_bytes("hi")], grpc.StatusCode.INVALID_ARGUMENT,
                           "first message must be a SessionConfig"),
    "no messages at all": ([], grpc.StatusCode.INVALID_ARGUMENT, "before a SessionConfig"),
    "two configs": ([cfg_bytes(), cfg_bytes()], grpc.StatusCode.INVALID_ARGUMENT,
                    "second SessionConfig"),
    "unknown voice": ([cfg_bytes(voice="nobody")], grpc.StatusCode.NOT_FOUND, "unknown voice"),
    "unknown language": ([cfg_bytes(language="klingon")], grpc.StatusCode.NOT_FOUND,
                         "unknown language"),
    "bad sample rate": ([cfg_bytes(sample_rate=44100)], grpc.StatusCode.INVALID_ARGUMENT,
                        "sample_rate 44100"),
    "bad frame_ms": ([cfg_bytes(frame_ms=25)], grpc.StatusCode.INVALID_ARGUMENT, "frame_ms 25"),
    "garbage bytes": ([b"\xff\xff\xff\xff\x0f"], grpc.StatusCode.INVALID_ARGUMENT,
                      "unparsable"),
    "invalid UTF-8 bytes": (
        [cfg_bytes(), tts_pb2.SynthesizeRequest(
            text=tts_pb2.TextDelta(utf8=b"ok \xff\xfe")).SerializeToString()],
        grpc.StatusCode.INVALID_ARGUMENT, "UTF-8"),
    # A string field holding invalid UTF-8 cannot even be parsed (proto3 rule).
    "invalid UTF-8 in a string field": (
        [cfg_bytes(), b"\x12\x04\x0a\x02\xc3\x28"], grpc.StatusCode.INVALID_ARGUMENT, "UTF-8"),
    "text over the limit": ([cfg_bytes(), text_bytes("a" * 5000)],
                            grpc.StatusCode.INVALID_ARGUMENT, "limit"),
    "unknown control": ([cfg_bytes(), tts_pb2.SynthesizeRequest(
        control=tts_pb2.Control(type=9)).SerializeToString()],
        grpc.StatusCode.INVALID_ARGUMENT, "Control.type"),
    "session_id over 128 characters": ([cfg_bytes(session_id="s" * 129)],
                                       grpc.StatusCode.INVALID_ARGUMENT, "session_id is 129"),
    "trace_id with a newline": ([cfg_bytes(trace_id="abc\nforged log line")],
                                grpc.StatusCode.INVALID_ARGUMENT, "trace_id holds control"),
    "bad temperature": ([tts_pb2.SynthesizeRequest(config=tts_pb2.SessionConfig(
        voice="vivian", sampling=tts_pb2.SamplingParams(temperature=9.0))).SerializeToString()],
        grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_input_gets_clear_status(server, case: str) -> None:
    reqs, want_code, want_text = CASES[case]
    code, details, _ = await call_with(server.addr, reqs)
    assert code == want_code, f"{case}: {code} {details}"
    assert want_text.lower() in details.lower(), f"{case}: {details!r}"
    # ... and the server still serves.
    async with grpc.aio.insecure_channel(server.addr) as ch:
        voices = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(tts_pb2.ListVoicesRequest())
    assert "vivian" in [v.name for v in voices.voices]


async def test_text_limit_counts_the_whole_utterance(server) -> None:
    pieces = [text_bytes("b" * 1000) for _ in range(5)]  # 5,000 > the 4,000 default
    code, details, _ = await call_with(server.addr, [cfg_bytes(), *pieces])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details


async def test_list_voices_describes_the_contract(server) -> None:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        v = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(tts_pb2.ListVoicesRequest())
    assert v.native_sample_rate == 24000
    assert list(v.sample_rates) == [16000, 24000, 48000] and list(v.frame_ms) == [10, 20, 40]
    assert "auto" in [lang.lower() for lang in v.languages] and v.max_text_chars == 4000
