"""API keys on a real server, with the clients users have: grpc with metadata, the real
`openai` SDK (`api_key` becomes `Authorization: Bearer`), an aiohttp WebSocket with the
header or `?api_key=`. Keys inline and from a file; the file rotated while the server
runs; health and metrics stay open; no key ever reaches the log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import ServerProc, config

INLINE, FROM_FILE, ROTATED = "inline-key-0123456789", "file-key-abcdefghij", "rotated-key-XYZ987"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("keyed")
    keyfile = tmp / "keys"
    keyfile.write_text(f"# one key a line\n{FROM_FILE}\n")
    s = ServerProc(tmp, TTS_API_KEYS=f"{INLINE}, ", TTS_API_KEYS_FILE=str(keyfile))
    yield s, keyfile
    s.stop()


async def speak(addr: str, key: str | None) -> bytes:
    meta = (("authorization", f"Bearer {key}"),) if key is not None else ()
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)

        async def reqs():  # type: ignore[no-untyped-def]
            yield tts_pb2.SynthesizeRequest(config=config())
            yield tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text="Hello there."))

        return b"".join([r.audio.pcm async for r in stub.Synthesize(reqs(), metadata=meta)
                         if r.WhichOneof("response") == "audio"])


async def test_grpc_needs_a_key_and_health_does_not(keyed) -> None:  # type: ignore[no-untyped-def]
    s, _ = keyed
    for key, words in ((None, "missing API key"), ("nope", "invalid API key")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await speak(s.addr, key)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        assert words in e.value.details()
    assert await speak(s.addr, INLINE) and await speak(s.addr, FROM_FILE)
    async with grpc.aio.insecure_channel(s.addr) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await tts_pb2_grpc.TextToSpeechStub(ch).ListVoices(tts_pb2.ListVoicesRequest())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_http_with_the_openai_sdk(keyed) -> None:  # type: ignore[no-untyped-def]
    s, _ = keyed
    url = f"http://127.0.0.1:{s.http_port}/v1"
    extra = {"sampling": {"max_frames": 6}, "stream": False}
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).audio.speech.create(
            model="tts-1", voice="vivian", input="Hi", extra_body=extra)
    assert e.value.status_code == 401 and "invalid API key" in str(e.value)
    r = openai.OpenAI(base_url=url, api_key=FROM_FILE).audio.speech.create(
        model="tts-1", voice="vivian", input="Hi", response_format="pcm", extra_body=extra)
    assert len(r.content) > 0
    import urllib.request

    for path in ("/healthz", "/metrics"):  # open: orchestrators and Prometheus
        with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}{path}") as resp:
            assert resp.status == 200


async def test_websocket_header_or_query_key(keyed) -> None:  # type: ignore[no-untyped-def]
    s, _ = keyed
    url = f"http://127.0.0.1:{s.http_port}/v1/audio/speech/stream"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await http.ws_connect(url)
        assert e.value.status == 401
        for kw in ({"headers": {"Authorization": f"Bearer {INLINE}"}},
                   {"params": {"api_key": FROM_FILE}}):
            async with http.ws_connect(url, **kw) as ws:
                await ws.send_json({"type": "config", "voice": "vivian",
                                    "sampling": {"max_frames": 4}})
                await ws.send_json({"type": "text", "text": "Hi."})
                await ws.send_json({"type": "end"})
                frames = [m async for m in ws if m.type == aiohttp.WSMsgType.BINARY]
                assert frames and ws.close_code == 1000


async def test_the_key_file_rotates_without_a_restart(keyed) -> None:  # type: ignore[no-untyped-def]
    s, keyfile = keyed
    keyfile.write_text(f"{ROTATED}\n")
    st = keyfile.stat()  # a new mtime even on a coarse clock
    os.utime(keyfile, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert await speak(s.addr, ROTATED)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await speak(s.addr, FROM_FILE)  # removed from the file: refused now
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await speak(s.addr, INLINE)  # the env's key is unchanged
    time.sleep(0.2)
    log = Path(s.log_path).read_text()
    assert "api_keys=required" in log
    assert not any(k in log for k in (INLINE, FROM_FILE, ROTATED))
