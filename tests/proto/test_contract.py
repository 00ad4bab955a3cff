"""The generated stubs carry the full contract and talk over a real localhost channel.

A tiny servicer per service echoes what the contract promises; the point is that the
stubs generated at build time from proto/ agree with the .proto files (message shapes,
oneofs, streaming kinds), not the behaviour of the real servers (tested in services/).
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


class EchoTTS(tts_pb2_grpc.TextToSpeechServicer):
    async def Synthesize(self, request_iterator, context) -> AsyncIterator:
        seq = 0
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "config":
                yield tts_pb2.SynthesizeResponse(
                    event=tts_pb2.Event(type=tts_pb2.Event.SESSION_STARTED, config=req.config)
                )
            elif kind == "text":
                piece = req.text.text.encode() or req.text.utf8
                yield tts_pb2.SynthesizeResponse(
                    audio=tts_pb2.AudioFrame(seq=seq, pcm=piece, start_ms=seq * 20)
                )
                seq += 1
            elif req.control.type == tts_pb2.Control.FLUSH:
                yield tts_pb2.SynthesizeResponse(
                    event=tts_pb2.Event(type=tts_pb2.Event.FLUSHED, next_seq=seq)
                )

    async def ListVoices(self, request, context):
        return tts_pb2.ListVoicesResponse(
            voices=[tts_pb2.Voice(name="vivian", languages=["chinese"])], native_sample_rate=24000
        )


class EchoThinker(thinker_pb2_grpc.ThinkerServicer):
    async def Chat(self, request, context):
        for msg in request.messages:
            for part in msg.parts:
                yield thinker_pb2.ChatDelta(request_id=request.request_id, text=part.text)
        yield thinker_pb2.ChatDelta(
            request_id=request.request_id,
            final=thinker_pb2.ChatFinal(finish_reason=thinker_pb2.FINISH_REASON_STOP),
        )


@pytest.fixture
async def channel():
    server = grpc.aio.server()
    tts_pb2_grpc.add_TextToSpeechServicer_to_server(EchoTTS(), server)
    thinker_pb2_grpc.add_ThinkerServicer_to_server(EchoThinker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(None)


async def test_tts_bidi_roundtrip(channel) -> None:
    stub = tts_pb2_grpc.TextToSpeechStub(channel)

    async def requests():
        yield tts_pb2.SynthesizeRequest(
            config=tts_pb2.SessionConfig(voice="vivian", sample_rate=16000, frame_ms=20, seed=7)
        )
        yield tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text="你好"))
        # A piece that ends inside a UTF-8 character travels as bytes.
        yield tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(utf8="世".encode()[:2]))
        yield tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.FLUSH))

    got = [r async for r in stub.Synthesize(requests())]
    assert [r.WhichOneof("response") for r in got] == ["event", "audio", "audio", "event"]
    assert got[0].event.config.seed == 7 and got[0].event.config.HasField("seed")
    assert got[1].audio.pcm == "你好".encode()
    assert got[2].audio.pcm == b"\xe4\xb8" and got[2].audio.start_ms == 20
    assert got[3].event.type == tts_pb2.Event.FLUSHED and got[3].event.next_seq == 2
    voices = await stub.ListVoices(tts_pb2.ListVoicesRequest())
    assert voices.voices[0].name == "vivian"


async def test_thinker_stream_roundtrip(channel) -> None:
    stub = thinker_pb2_grpc.ThinkerStub(channel)
    req = thinker_pb2.ChatRequest(
        request_id="r1",
        messages=[
            thinker_pb2.Message(
                role=thinker_pb2.ROLE_USER,
                parts=[
                    thinker_pb2.Part(text="hi"),
                    thinker_pb2.Part(
                        audio=thinker_pb2.AudioPart(
                            data=b"\0\0", format=thinker_pb2.AUDIO_FORMAT_PCM_S16LE,
                            sample_rate=16000,
                        )
                    ),
                ],
            )
        ],
    )
    got = [d async for d in stub.Chat(req)]
    assert [d.text for d in got] == ["hi", "", ""]
    assert got[-1].HasField("final") and all(d.request_id == "r1" for d in got)


def test_optional_fields_have_presence() -> None:
    """Unset sampling overrides must be distinguishable from zero (proto3 `optional`)."""
    s = tts_pb2.SamplingParams()
    assert not s.HasField("temperature")
    s.temperature = 0.0
    assert s.HasField("temperature")
    assert not thinker_pb2.ChatRequest().HasField("temperature")


def test_buf_lint_and_breaking() -> None:
    """The real proto linter, and wire compatibility with the released v1 image."""
    out = subprocess.run(
        ["bash", str(ROOT / "tests/proto/buf.sh"), "lint"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
