"""The voice library on real servers (tiny Base / VoiceDesign presets, random weights):
voices made over HTTP (aiohttp's client, the `openai` SDK for speech), gRPC and used by
name on every front; kept across a restart; every bad input refused with its status and
nothing lost, nothing written outside the library's directory."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import openai
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_tts.client.api import synthesize

from .conftest import ServerProc, config
from .test_cli_random import _cli

RATE = 16000
LIMIT = 1_500_000  # TTS_VOICE_MAX_UPLOAD_BYTES of the module's server


def tone(seconds: float, rate: int = RATE, amp: float = 0.3, seed: int = 0) -> np.ndarray:
    """Speech stand-in: a few harmonics and noise (not silent, not clipped)."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    x = sum(np.sin(2 * np.pi * f * t) / (i + 1) for i, f in enumerate((180, 360, 540)))
    return (amp * x / 1.8 + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def wav(x: np.ndarray, rate: int = RATE, channels: int = 1) -> bytes:
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return b.getvalue()


def url(server: ServerProc, path: str = "") -> str:
    return f"http://127.0.0.1:{server.http_port}/v1/audio/voices{path}"


async def create(server: ServerProc, name: str, audio: bytes | None = None,
                 **fields: str) -> tuple[int, dict]:
    form = aiohttp.FormData()
    form.add_field("name", name)
    for k, v in fields.items():
        form.add_field(k, v)
    if audio is not None:
        form.add_field("audio_sample", audio, filename="ref.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as s, s.post(url(server), data=form) as r:
        return r.status, await r.json()


async def http(server: ServerProc, method: str, path: str = "") -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, url(server, path)) as r:
        return r.status, await r.json()


def library_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def sdk(server: ServerProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="none",
                         max_retries=0)


SPEAK = {"seed": 7, "sampling": {"greedy": True, "max_frames": 6}, "stream": False}


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("library") / "voices"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, voice_dir: Path):
    s = ServerProc(tmp_path_factory.mktemp("tts-base"), TTS_MODEL="preset:tiny-base",
                   TTS_VOICE_DIR=str(voice_dir), TTS_VOICE_MAX_UPLOAD_BYTES=str(LIMIT))
    asyncio.run(create(s, "alice", wav(tone(4)), ref_text="Hello, this is Alice."))
    yield s
    s.stop()


# --- HTTP --------------------------------------------------------------------------------


async def test_http_create_list_get_speak_delete(base: ServerProc, voice_dir: Path) -> None:
    status, body = await create(base, "Bob_2", wav(tone(5, 44100, seed=1), 44100),
                                consent="user-123")
    assert status == 200, body
    v = body["voice"]
    assert body["success"] and v["name"] == "bob_2" and v["kind"] == "clone"
    assert v["x_vector_only"] and v["consent"] == "user-123"  # no transcript: x-vector only
    assert v["duration_s"] == pytest.approx(5.0) and v["source_rate"] == 44100
    status, listed = await http(base, "GET")
    assert {("alice", "clone"), ("bob_2", "clone")} <= {(x["name"], x["kind"])
                                                        for x in listed["voices"]}
    assert {"alice", "bob_2"} <= {x["name"] for x in listed["uploaded_voices"]}
    status, got = await http(base, "GET", "/BOB_2")
    assert status == 200 and got["name"] == "bob_2" and got["model_type"] == "base"
    assert "bob_2.voice.npz" in library_files(voice_dir)
    assert base.metric('tts_voice_create_seconds_count{kind="clone"}') >= 2
    assert base.metric("tts_library_voices") == len(listed["uploaded_voices"])
    for voice in ("bob_2", "BOB_2"):  # names are case-insensitive, as presets' are
        r = sdk(base).audio.speech.create(model="tts-1", voice=voice, input="Hi there.",
                                          response_format="wav", extra_body=SPEAK)
        with wave.open(io.BytesIO(r.content)) as w:
            assert w.getnframes() > 0
    status, body = await http(base, "DELETE", "/bob_2")
    assert status == 200 and body["success"]
    assert "bob_2.voice.npz" not in library_files(voice_dir)
    with pytest.raises(openai.NotFoundError, match="unknown voice"):
        sdk(base).audio.speech.create(model="tts-1", voice="bob_2", input="Hi.",
                                      extra_body=SPEAK)
    assert (await http(base, "DELETE", "/bob_2"))[0] == 404
    assert (await http(base, "GET", "/bob_2"))[0] == 404


def test_openai_sdk_voices_create_speak_delete(base: ServerProc) -> None:
    """OpenAI's own custom-voice calls, through its SDK: create, speak with
    `voice={"id": ...}`, delete."""
    client = sdk(base)
    v = client.audio.voices.create(audio_sample=("me.wav", wav(tone(4, seed=9)), "audio/wav"),
                                   consent="cons_123", name="sdk_voice")
    assert (v.id, v.name, v.object, v.type) == ("sdk_voice", "sdk_voice", "audio.voice",
                                                "audio_sample")
    assert v.created_at > 0
    r = client.audio.speech.create(model="tts-1", voice={"id": v.id}, input="Hi there.",
                                   response_format="wav", extra_body=SPEAK)
    assert len(r.content) > 44
    gone = client.audio.voices.delete(v.id)
    assert (gone.id, gone.deleted, gone.object) == ("sdk_voice", True, "audio.voice.deleted")
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete(v.id)


async def test_http_raw_pcm_any_rate_and_stereo(base: ServerProc) -> None:
    stereo = np.stack([tone(3.5, 48000), tone(3.5, 48000, seed=2)], axis=1)
    status, body = await create(base, "pcm_f32", stereo.astype("<f4").tobytes(),
                                format="pcm_f32le", sample_rate="48000", channels="2",
                                ref_text="Some words.")
    assert status == 200, body
    assert body["voice"]["duration_s"] == pytest.approx(3.5)
    assert not body["voice"]["x_vector_only"]
    s16 = (tone(3.2, 22050) * 32767).astype("<i2").tobytes()
    status, body = await create(base, "pcm_s16", s16, format="pcm_s16le",
                                sample_rate="22050", x_vector_only="true",
                                ref_text="ignored words")
    assert status == 200 and body["voice"]["x_vector_only"], body
    for name in ("pcm_f32", "pcm_s16"):
        assert (await http(base, "DELETE", f"/{name}"))[0] == 200


BAD_AUDIO = [
    ("not audio", b"this is not audio at all" * 100, {}, 400, "not a WAV"),
    ("too short", wav(tone(1.0)), {}, 400, "must be 3 to 30 s"),
    ("too long", wav(tone(31.0, 8000), 8000), {}, 400, "must be 3 to 30 s"),
    ("silent", wav(np.zeros(RATE * 4)), {}, 400, "silent"),
    ("NaN", np.full(RATE * 4, np.nan, "<f4").tobytes(),
     {"format": "pcm_f32le", "sample_rate": str(RATE)}, 400, "NaN"),
    ("PCM without a rate", wav(tone(4))[44:], {"format": "pcm_s16le"}, 400, "sample_rate"),
    ("odd PCM bytes", wav(tone(4))[45:], {"format": "pcm_s16le", "sample_rate": "16000"},
     400, "whole number"),
    ("unknown format", wav(tone(4)), {"format": "mp3"}, 400, "unknown audio format"),
    ("over the upload limit", wav(tone(29, 32000), 32000), {}, 413, "TTS_VOICE_MAX_UPLOAD"),
    ("a body far over it", wav(tone(30, 48000), 48000), {}, 413, "TTS_VOICE_MAX_UPLOAD"),
    ("a rate out of range", wav(tone(4, 4000), 4000), {}, 400, "8000..192000"),
    ("raw PCM, a wrong rate", wav(tone(4))[44:], {"format": "pcm_s16le",
                                                 "sample_rate": "1000000"}, 400, "8000..192000"),
]


@pytest.mark.parametrize("what,audio,fields,status,message", BAD_AUDIO,
                         ids=[b[0] for b in BAD_AUDIO])
async def test_bad_audio_is_refused_and_nothing_is_stored(
        base: ServerProc, voice_dir: Path, what: str, audio: bytes, fields: dict,
        status: int, message: str) -> None:
    before = library_files(voice_dir)
    got, body = await create(base, "bad", audio, **fields)
    assert got == status, body
    assert message in body["error"]["message"]
    assert library_files(voice_dir) == before


async def test_clipped_audio_is_kept_with_a_warning(base: ServerProc) -> None:
    status, body = await create(base, "loud", wav(np.clip(tone(4, amp=3.0), -1, 1)))
    assert status == 200, body
    assert body["voice"]["warnings"] and "clipped" in body["voice"]["warnings"][0]
    assert (await http(base, "DELETE", "/loud"))[0] == 200


BAD_NAMES = ["../evil", "a/b", "..", ".hidden", "a b", "", "x" * 65, "nul\x00", "é",
             "alice.voice", "C:\\x"]


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_names_with_path_characters_are_refused(base: ServerProc, voice_dir: Path,
                                                      name: str) -> None:
    before = library_files(voice_dir)
    outside = sorted(p.name for p in voice_dir.parent.iterdir())
    status, body = await create(base, name, wav(tone(4)))
    assert status == 400, body
    assert "not allowed" in body["error"]["message"]
    assert library_files(voice_dir) == before
    assert sorted(p.name for p in voice_dir.parent.iterdir()) == outside


@pytest.mark.parametrize("path", ["/..%2F..%2Fetc%2Fpasswd", "/%2E%2E", "/alice%00",
                                  "/..%5Calice"])
async def test_path_characters_in_urls_reach_no_file(base: ServerProc, voice_dir: Path,
                                                     path: str) -> None:
    before = library_files(voice_dir)
    for method in ("GET", "DELETE"):
        async with aiohttp.ClientSession() as s, \
                s.request(method, url(base) + path) as r:
            assert r.status == 404
    assert library_files(voice_dir) == before


async def test_name_clash_is_409_and_keeps_the_first(base: ServerProc) -> None:
    status, body = await create(base, "ALICE", wav(tone(4, seed=3)))
    assert status == 409 and "exists" in body["error"]["message"], body
    status, got = await http(base, "GET", "/alice")
    assert got["ref_text"] == "Hello, this is Alice."


async def test_bad_requests(base: ServerProc) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(url(base), data=b"name=x", headers={"Content-Type":
                                                                  "text/plain"}) as r:
            assert r.status == 415
        async with s.post(url(base), json={"name": "x", "voice": "y"}) as r:
            assert r.status == 400 and "unknown field 'voice'" in (await r.text())
        async with s.post(url(base), json={"name": "x", "prompt": "A voice."}) as r:
            assert r.status == 501  # a description on a Base server
        form = aiohttp.FormData()
        form.add_field("name", "x")
        form.add_field("nonsense", "1")
        async with s.post(url(base), data=form) as r:
            assert r.status == 400 and "unknown form field" in (await r.text())
    status, body = await create(base, "nofile")
    assert status == 400 and "audio_sample" in body["error"]["message"]
    status, body = await create(base, "designed", description="A warm low voice.")
    assert status == 501 and "VoiceDesign" in body["error"]["message"]


# --- a session keeps its voice ----------------------------------------------------------


async def test_a_voice_deleted_mid_session_keeps_speaking(base: ServerProc) -> None:
    assert (await create(base, "doomed", wav(tone(4, seed=4)), ref_text="Doomed."))[0] == 200
    async with grpc.aio.insecure_channel(base.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=config(voice="doomed")))
        await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text="First.")))
        await call.write(tts_pb2.SynthesizeRequest(control=tts_pb2.Control(
            type=tts_pb2.Control.FLUSH)))
        flushed, frames = 0, 0
        async for r in call:
            if r.WhichOneof("response") == "audio":
                frames += 1
                if frames == 1:  # deleted while its first utterance is being spoken
                    assert (await http(base, "DELETE", "/doomed"))[0] == 200
            elif r.event.type == tts_pb2.Event.FLUSHED:
                flushed += 1
                if flushed == 1:  # and the session's next utterance still has it
                    await call.write(tts_pb2.SynthesizeRequest(
                        text=tts_pb2.TextDelta(text="Second.")))
                    await call.done_writing()
                    first = frames
        assert flushed == 2 and frames > first > 1
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await synthesize(ch, ["Hi."], config(voice="doomed"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


# --- gRPC --------------------------------------------------------------------------------


async def test_grpc_create_list_get_delete_and_speak(base: ServerProc) -> None:
    stereo = np.stack([tone(4, 44100), tone(4, 44100, seed=5)], axis=1)
    ref = tts_pb2.ReferenceAudio(audio=(stereo * 32767).astype("<i2").tobytes(),
                                 format=tts_pb2.ReferenceAudio.FORMAT_PCM_S16LE,
                                 sample_rate=44100, channels=2, ref_text="Over gRPC.")
    async with grpc.aio.insecure_channel(base.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        made = await stub.CreateVoice(tts_pb2.CreateVoiceRequest(name="Carol",
                                                                  reference=ref))
        assert (made.voice.name, made.voice.kind, made.voice.ref_text) == \
            ("carol", "clone", "Over gRPC.")
        listed = await stub.ListVoices(tts_pb2.ListVoicesRequest())
        assert {"alice", "carol"} <= {v.name for v in listed.voices if v.kind == "clone"}
        got = await stub.GetVoice(tts_pb2.GetVoiceRequest(name="CAROL"))
        assert got.voice.duration_s == pytest.approx(4.0)
        res = await synthesize(ch, ["Hello from Carol."], config(voice="carol"))
        assert res.pcm and res.events[-1].type == tts_pb2.Event.FLUSHED
        for request, code in [
            (tts_pb2.CreateVoiceRequest(name="carol", reference=ref),
             grpc.StatusCode.ALREADY_EXISTS),
            (tts_pb2.CreateVoiceRequest(name="../x", reference=ref),
             grpc.StatusCode.INVALID_ARGUMENT),
            (tts_pb2.CreateVoiceRequest(name="x", reference=tts_pb2.ReferenceAudio(
                audio=b"RIFF nonsense")), grpc.StatusCode.INVALID_ARGUMENT),
            (tts_pb2.CreateVoiceRequest(name="x", description="Bright and fast."),
             grpc.StatusCode.UNIMPLEMENTED),
            (tts_pb2.CreateVoiceRequest(name="x", reference=tts_pb2.ReferenceAudio(
                audio=b"\0" * (LIMIT + 2))), grpc.StatusCode.RESOURCE_EXHAUSTED),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.CreateVoice(request)
            assert e.value.code() == code, e.value.details()
        await stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(name="carol"))
        for rpc in (stub.GetVoice(tts_pb2.GetVoiceRequest(name="carol")),
                    stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(name="carol"))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await rpc
            assert e.value.code() == grpc.StatusCode.NOT_FOUND


# --- WebSocket ---------------------------------------------------------------------------


async def test_websocket_speaks_with_a_library_voice(base: ServerProc) -> None:
    ws_url = f"http://127.0.0.1:{base.http_port}/v1/audio/speech/stream"
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json({"type": "config", "voice": "Alice", "seed": 7,
                            "sampling": {"greedy": True, "max_frames": 6}})
        await ws.send_json({"type": "text", "text": "Hello from the socket."})
        await ws.send_json({"type": "end"})
        events, frames = [], 0
        async with asyncio.timeout(60):
            async for m in ws:
                if m.type == aiohttp.WSMsgType.BINARY:
                    frames += 1
                else:
                    events.append(json.loads(m.data))
        assert ws.close_code == 1000, events
    assert events[0]["config"]["voice"] == "alice" and events[-1]["type"] == "flushed"
    assert frames > 0


# --- across a restart, other models, a damaged library, a full disk ----------------------


async def test_the_library_survives_a_restart(make_server, tmp_path: Path) -> None:
    d = tmp_path / "voices"
    a = make_server(TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(d))
    assert (await create(a, "keeper", wav(tone(4)), ref_text="Kept."))[0] == 200
    assert (await create(a, "xvec", wav(tone(3.5, 24000), 24000)))[0] == 200
    a.stop()
    (d / ".tmp-half-written").write_bytes(b"half a voice")  # a crash mid-write
    (d / "broken.voice.npz").write_bytes(b"not a zip")  # a damaged file
    (d / "notes.txt").write_text("not a voice")
    outside = tmp_path / "outside.npz"  # a link out of the directory is never followed
    outside.write_bytes((d / "keeper.voice.npz").read_bytes())
    (d / "linked.voice.npz").symlink_to(outside)
    b = make_server(TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(d))
    status, listed = await http(b, "GET")
    lib = {v["name"]: v for v in listed["uploaded_voices"]}
    assert set(lib) == {"keeper", "xvec"}
    assert lib["keeper"]["ref_text"] == "Kept." and lib["xvec"]["x_vector_only"]
    async with grpc.aio.insecure_channel(b.addr) as ch:
        for name in lib:
            assert (await synthesize(ch, ["Still here."], config(voice=name))).pcm
    assert ".tmp-half-written" not in library_files(d)
    assert "broken.voice.npz" in library_files(d)  # kept for a person to look at
    assert "unreadable" in b.log_path.read_text()
    b.stop()
    # A server of another model size skips them (and says so); they stay on disk, and
    # their names cannot be taken over there.
    kept = (d / "keeper.voice.npz").read_bytes()
    c = make_server(TTS_MODEL="preset:tiny-1.7b-base", TTS_VOICE_DIR=str(d))
    status, listed = await http(c, "GET")
    assert listed["uploaded_voices"] == [] and "made for a" in c.log_path.read_text()
    for name in ("keeper", "broken"):
        status, body = await create(c, name, wav(tone(4)))
        assert status == 409 and "cannot use" in body["error"]["message"], body
    assert (d / "keeper.voice.npz").read_bytes() == kept
    assert (await create(c, "mine", wav(tone(4))))[0] == 200  # its own voices work


async def _until(check, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def test_servers_sharing_a_directory_follow_each_other(make_server,
                                                             tmp_path: Path) -> None:
    """Replicas on one volume: a voice one creates is spoken by the other within the
    rescan period; one deletes it, the other lets it go."""
    d = tmp_path / "voices"
    a, b = (make_server(TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(d),
                        TTS_VOICE_RESCAN_S="0.2") for _ in range(2))
    assert (await create(a, "shared", wav(tone(4)), ref_text="Shared."))[0] == 200

    async def b_has(want: bool):
        return ((await http(b, "GET", "/shared"))[0] == 200) == want

    await _until(lambda: b_has(True))
    async with grpc.aio.insecure_channel(b.addr) as ch:
        assert (await synthesize(ch, ["From b."], config(voice="shared"))).pcm
    assert (await create(b, "SHARED", wav(tone(4))))[0] == 409  # the name is taken there too
    assert (await http(a, "DELETE", "/shared"))[0] == 200
    await _until(lambda: b_has(False))
    assert "appeared in the directory" in b.log_path.read_text()


FSIZE_LIMIT = 120_000  # bytes a file of the server may grow to (RLIMIT_FSIZE)
LIMITED = ["-c", "import resource, runpy; resource.setrlimit(resource.RLIMIT_FSIZE, "
           f"({FSIZE_LIMIT}, {FSIZE_LIMIT})); runpy.run_module('voice_tts.server', "
           "run_name='__main__')"]


async def test_a_full_disk_fails_the_create_cleanly(make_server, tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk (the write fails the same way, EFBIG
    beside ENOSPC): the create answers 507, no file is left, the library goes on."""
    d = tmp_path / "voices"
    s = make_server(LIMITED, TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(d))
    assert (await create(s, "small", wav(tone(3.2, 8000), 8000)))[0] == 200
    status, body = await create(s, "big", wav(tone(8, 16000), 16000), ref_text="Big one.")
    assert status == 507 and "disk is full" in body["error"]["message"], body
    assert library_files(d) == ["small.voice.npz"]
    status, listed = await http(s, "GET")
    assert [v["name"] for v in listed["uploaded_voices"]] == ["small"]
    async with grpc.aio.insecure_channel(s.addr) as ch:
        assert (await synthesize(ch, ["Fine."], config(voice="small"))).pcm


# --- other checkpoints -------------------------------------------------------------------


async def test_voice_design_and_a_checkpoint_that_cannot_clone(make_server,
                                                               tmp_path: Path) -> None:
    d = tmp_path / "voices"
    s = make_server(TTS_MODEL="preset:tiny-1.7b-design", TTS_VOICE_DIR=str(d))
    status, body = await create(s, "narrator",
                                description="A calm, deep male voice, speaking slowly.")
    assert status == 200 and body["voice"]["kind"] == "design", body
    assert body["type"] == "prompt" and body["prompt"].startswith("A calm")
    made = sdk(s).audio.voices.create(name="bright", prompt="A bright, quick voice.",
                                      type="prompt")  # OpenAI's prompt-based create
    assert (made.type, made.prompt) == ("prompt", "A bright, quick voice.")
    r = sdk(s).audio.speech.create(model="tts-1", voice="narrator", input="Once upon.",
                                   response_format="pcm", extra_body=SPEAK)
    assert len(r.content) > 0
    status, body = await create(s, "clone", wav(tone(4)))
    assert status == 501 and "cannot clone" in body["error"]["message"]


async def test_no_library_configured(server: ServerProc) -> None:
    status, body = await create(server, "x", wav(tone(4)))
    assert status == 501 and "TTS_VOICE_DIR" in body["error"]["message"]
    status, listed = await http(server, "GET")
    assert listed["uploaded_voices"] == [] and {v["kind"] for v in listed["voices"]} == \
        {"preset"}
    assert (await http(server, "DELETE", "/vivian"))[0] == 400


# --- inline reference audio (one request, nothing stored) --------------------------------


async def test_grpc_inline_reference_audio(base: ServerProc, server: ServerProc) -> None:
    ref = tts_pb2.ReferenceAudio(audio=wav(tone(4, seed=6)), ref_text="Inline words.")
    async with grpc.aio.insecure_channel(base.addr) as ch:
        res = await synthesize(ch, ["Hello, inline."], config(voice="", reference=ref))
        assert res.pcm and res.events[-1].type == tts_pb2.Event.FLUSHED
        started = res.events[0].config
        assert started.voice.startswith("~inline-") and not started.HasField("reference")
        listed = await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(
            tts_pb2.ListVoicesRequest())
        assert not [v.name for v in listed.voices if v.name.startswith("~")]
        for cfg, code in [
            (config(voice="", reference=tts_pb2.ReferenceAudio(audio=wav(tone(1)))),
             grpc.StatusCode.INVALID_ARGUMENT),  # too short
            (config(voice="alice", reference=ref), grpc.StatusCode.INVALID_ARGUMENT),
            (config(voice="", reference=tts_pb2.ReferenceAudio(audio=b"\0" * (LIMIT + 1))),
             grpc.StatusCode.INVALID_ARGUMENT),  # too large: a bad request, not a 429
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await synthesize(ch, ["Hi."], cfg)
            assert e.value.code() == code, e.value.details()
    async with grpc.aio.insecure_channel(server.addr) as ch:  # CustomVoice: cannot clone
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await synthesize(ch, ["Hi."], config(voice="", reference=ref))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_http_inline_reference_audio_and_voice_objects(base: ServerProc) -> None:
    import base64

    data_url = "data:audio/wav;base64," + base64.b64encode(wav(tone(4, seed=7))).decode()
    r = sdk(base).audio.speech.create(model="tts-1", voice="", input="Inline over HTTP.",
                                      response_format="wav",
                                      extra_body={**SPEAK, "ref_audio": data_url,
                                                  "ref_text": "Some words."})
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getnframes() > 0
    speech = f"http://127.0.0.1:{base.http_port}/v1/audio/speech"
    async with aiohttp.ClientSession() as s:
        for ref_audio, message in [("https://example.com/a.wav", "fetches none"),
                                   ("not base64!", "not base64"),
                                   (base64.b64encode(b"noise" * 99).decode(), "not a WAV")]:
            async with s.post(speech, json={"input": "Hi.", "voice": "",
                                            "ref_audio": ref_audio}) as resp:
                assert resp.status == 400
                assert message in (await resp.json())["error"]["message"]
        # OpenAI's custom-voice form of `voice`
        async with s.post(speech, json={"input": "Hi.", "voice": {"id": "alice"},
                                        **SPEAK}) as resp:
            assert resp.status == 200 and len(await resp.read()) > 44


# --- the CLI -----------------------------------------------------------------------------




async def test_cli_voices_create_list_speak_delete(base: ServerProc, tmp_path: Path) -> None:
    ref = tmp_path / "me.wav"
    ref.write_bytes(wav(tone(4, seed=8)))
    rc, out, err = await _cli("voices", "--addr", base.addr, "create", "cli_me", "--audio",
                              str(ref), "--ref-text", "It is me.")
    assert rc == 0 and out.startswith("created cli_me\tclone"), err
    rc, out, err = await _cli("voices", "--addr", base.addr, "list")
    assert rc == 0 and "cli_me\tclone" in out, err
    for how in (["--voice", "cli_me"], ["--ref-audio", str(ref), "--ref-text", "It is me."]):
        rc, out, err = await _cli("--addr", base.addr, "--text", "Hi.", "--max-frames", "4",
                                  "--out", str(tmp_path / "out.wav"), *how)
        assert rc == 0 and "wrote" in out, err
    rc, out, err = await _cli("voices", "--addr", base.addr, "delete", "cli_me")
    assert rc == 0, err
    rc, out, err = await _cli("voices", "--addr", base.addr, "get", "cli_me")
    assert rc == 1 and "NOT_FOUND" in err


async def test_a_reference_too_long_for_the_slots_is_refused(make_server,
                                                             tmp_path: Path) -> None:
    """An in-context prompt must fit TTS_MAX_SEQ_LEN with room to speak: else 400, and
    nothing is stored (its x-vector-only clone fits)."""
    d = tmp_path / "voices"
    s = make_server(TTS_MODEL="preset:tiny-base", TTS_VOICE_DIR=str(d), TTS_MAX_SEQ_LEN="256")
    status, body = await create(s, "long", wav(tone(10)), ref_text="Ten seconds of words.")
    assert status == 400 and "max_seq_len" in body["error"]["message"], body
    assert library_files(d) == []
    assert (await create(s, "long", wav(tone(10)), x_vector_only="true"))[0] == 200
