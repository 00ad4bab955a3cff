"""One server, several checkpoints, one voice namespace (`TTS_MODEL=a,b,c`): the tiny
CustomVoice, Base and VoiceDesign presets (random weights) behind one server, as the
stack `make up` starts runs them. Presets, clones and designed voices are listed together
with their kinds, each spoken by the checkpoint that owns it over gRPC and HTTP, a clone
cannot take a preset's name, and a restart loads both kinds of stored voice back."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_tts.client.api import synthesize

from .conftest import ServerProc, config
from .test_voice_library import SPEAK, create, http, sdk, tone, wav

MODELS = "preset:tiny,preset:tiny-base,preset:tiny-1.7b-design"


def start(tmp: Path, voice_dir: Path) -> ServerProc:
    return ServerProc(tmp, TTS_MODEL=MODELS, TTS_VOICE_DIR=str(voice_dir))


async def grpc_voices(s: ServerProc) -> tuple[dict[str, str], str]:
    async with grpc.aio.insecure_channel(s.addr) as ch:
        got = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(tts_pb2.ListVoicesRequest())
    return {v.name: v.kind for v in got.voices}, got.model


async def speak(s: ServerProc, voice: str) -> int:
    async with grpc.aio.insecure_channel(s.addr) as ch:
        res = await synthesize(ch, ["Hello there."], config(voice=voice))
    return res.frames


async def test_presets_clones_and_designs_from_one_server(tmp_path: Path) -> None:
    voice_dir = tmp_path / "voices"
    s = start(tmp_path, voice_dir)
    try:
        status, body = await create(s, "alice", wav(tone(4)), ref_text="Hello, I am Alice.")
        assert status == 200 and body["voice"]["kind"] == "clone", body
        assert body["voice"]["model_type"] == "base"
        status, body = await create(s, "calm", description="A calm, low voice.")
        assert status == 200 and body["voice"]["kind"] == "design", body
        # a name is one voice: a clone cannot take a preset's (another checkpoint's) name
        status, body = await create(s, "Vivian", wav(tone(4, seed=3)))
        assert status == 409 and "preset" in body["error"]["message"], body

        kinds, model = await grpc_voices(s)
        assert model == "preset:tiny+preset:tiny-base+preset:tiny-1.7b-design"
        assert kinds["vivian"] == "preset" and kinds["alice"] == "clone"
        assert kinds["calm"] == "design"
        status, listed = await http(s, "GET")
        assert {(v["name"], v["kind"]) for v in listed["voices"]} >= {
            ("vivian", "preset"), ("alice", "clone"), ("calm", "design")}
        # each voice spoken by its own checkpoint, over gRPC and the OpenAI HTTP route
        for voice in ("vivian", "alice", "calm"):
            assert await speak(s, voice) > 0, voice
            r = sdk(s).audio.speech.create(model="tts-1", voice=voice, input="Hi.",
                                           response_format="pcm", extra_body=SPEAK)
            assert len(r.content) > 0, voice
        # an inline reference goes to the checkpoint that clones
        cfg = config(voice="")
        cfg.reference.audio = wav(tone(4, seed=5))
        async with grpc.aio.insecure_channel(s.addr) as ch:
            res = await synthesize(ch, ["Hi."], cfg)
        assert res.frames > 0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await speak(s, "nobody")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown voice" in (e.value.details() or "")
    finally:
        s.stop()

    # a restart loads each stored voice into the checkpoint that speaks it
    s = start(tmp_path, voice_dir)
    try:
        kinds, _ = await grpc_voices(s)
        assert kinds["alice"] == "clone" and kinds["calm"] == "design"
        assert await speak(s, "alice") > 0 and await speak(s, "calm") > 0
    finally:
        s.stop()
