"""Bad reference audio on a real Base server (issue 51): a WAV built to make the decoder
walk millions of chunks is refused at once and no open stream waits for it (the decode
runs off the event loop, and its chunk walk is capped); an unknown `ReferenceAudio.format`
number is INVALID_ARGUMENT naming the formats on CreateVoice and Synthesize; a multipart
part with a garbage header line is a 400, not a 500."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import aiohttp
import grpc
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_tts.client.api import synthesize

from .conftest import ServerProc, config
from .test_voice_library import create, tone, url, wav

LIMIT = 20_000_000  # TTS_VOICE_MAX_UPLOAD_BYTES: room for the 16 MiB file of the issue


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("tts-doors")
    s = ServerProc(tmp, TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(tmp / "voices"),
                   TTS_VOICE_MAX_UPLOAD_BYTES=str(LIMIT), TTS_PACE_LEAD_S="0.2")
    status, body = asyncio.run(create(s, "alice", wav(tone(4)), ref_text="Hello, Alice."))
    assert status == 200, body
    yield s
    s.stop()


def junk_wav(chunks: int = 2_000_000) -> bytes:
    """A valid 4 s WAV with `chunks` empty `junk` chunks between fmt and data (~16 MiB)."""
    good = wav(tone(4))
    fmt_end = 12 + 8 + struct.unpack("<I", good[16:20])[0]
    body = good[12:fmt_end] + b"junk\0\0\0\0" * chunks + good[fmt_end:]
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


async def test_a_chunk_bomb_is_refused_at_once_and_the_loop_never_waits_for_it(
        base: ServerProc) -> None:
    """A paced stream is open while the bomb uploads; `/healthz`, answered by the same event
    loop that paces every stream, is probed all the while. Decoded on the loop (the bug), the
    walk held it ~2.1 s (a paced stream's 2.37 s gap). The stream's own gaps are not the
    measure: on a busy 2-core host the tiny engine falls behind real time by itself."""
    bomb = junk_wav()
    http = f"http://127.0.0.1:{base.http_port}"
    probes: list[float] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{http}/v1/audio/speech/stream") as ws:
        await ws.send_json({"type": "config", "voice": "alice", "seed": 7,
                            "sampling": {"greedy": True, "max_frames": 50}})  # 4 s
        await ws.send_json({"type": "text", "text": "Hello there, how are you today? " * 4})
        await ws.send_json({"type": "end"})
        async with asyncio.timeout(60):
            while (await ws.receive()).type != aiohttp.WSMsgType.BINARY:
                pass  # `started`, `first_audio`: then the audio, paced

        async def probe() -> None:
            while True:
                t = time.perf_counter()
                async with s.get(f"{http}/healthz") as r:
                    assert r.status == 200
                probes.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)

        prober = asyncio.create_task(probe())
        t0 = time.perf_counter()
        form = aiohttp.FormData()
        form.add_field("name", "bomb")
        form.add_field("audio_sample", bomb, filename="ref.wav", content_type="audio/wav")
        async with s.post(url(base), data=form) as r:
            status, body = r.status, await r.json()
        took = time.perf_counter() - t0
        await asyncio.sleep(0.1)  # a probe in flight when the answer came finishes
        prober.cancel()
        events = [json.loads(m.data)["type"] async for m in ws if m.type == aiohttp.WSMsgType.TEXT]
    assert events[-1:] == ["flushed"] and ws.close_code == 1000, (events, ws.close_code)
    assert status == 400 and "chunks" in body["error"]["message"], body
    assert took < 1.5, f"the refusal took {took:.2f} s"
    assert probes and max(probes) < 0.75, \
        f"the server's loop answered /healthz in up to {max(probes):.2f} s during the upload"


FORMATS = ("FORMAT_UNSPECIFIED", "FORMAT_WAV", "FORMAT_PCM_S16LE", "FORMAT_PCM_F32LE")


async def test_an_unknown_reference_format_is_invalid_argument(base: ServerProc) -> None:
    ref = tts_pb2.ReferenceAudio(audio=wav(tone(4)), ref_text="Hi.")
    ref.format = 99  # proto3 enums are open: any number arrives
    async with grpc.aio.insecure_channel(base.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        calls = [stub.CreateVoice(tts_pb2.CreateVoiceRequest(name="fmt99", reference=ref)),
                 synthesize(ch, ["Hi."], config(voice="", reference=ref))]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            msg = e.value.details()
            assert "format 99" in msg and all(f in msg for f in FORMATS), msg


async def test_a_garbage_part_header_is_a_400(base: ServerProc) -> None:
    body = (b"--b\r\ngarbage\r\n\r\nxyz\r\n"
            b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n')
    async with aiohttp.ClientSession() as s, s.post(
            url(base), data=body,
            headers={"Content-Type": "multipart/form-data; boundary=b"}) as r:
        text = await r.text()
        assert r.status == 400, text
    assert "malformed multipart" in json.loads(text)["error"]["message"]
