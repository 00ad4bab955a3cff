"""`POST /v1/audio/speech` on a real server, through the real `openai` SDK (a client none
of us wrote) and raw HTTP for what the SDK would not send: the audio equals the gRPC
path's for the same text and greedy config, streamed responses arrive in pieces, and every
bad request gets its status and an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import signal
import time
import wave

import aiohttp
import grpc
import openai
import pytest
from voice_tts.client.api import synthesize

from .conftest import config

TEXT = "Hello there, streaming world, how are you today?"
FRAMES = 12  # codec frames (80 ms each): the tiny random model rarely stops before
EXTRA = {"seed": 7, "sampling": {"greedy": True, "max_frames": FRAMES}}


def client(server, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="none",
                         **kw)


async def grpc_pcm(server, text: str = TEXT, **kw: object) -> bytes:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        res = await synthesize(ch, [text], config(seed=7, **kw))
    return res.pcm


@pytest.fixture(scope="module")
def reference(server) -> bytes:
    pcm = asyncio.run(grpc_pcm(server, sampling={"max_frames": FRAMES}))
    assert pcm, "the gRPC path made no audio"
    return pcm


def test_models_and_voices_are_listed(server) -> None:
    models = [m.id for m in client(server).models.list()]
    assert "tts-1" in models and "preset:tiny" in models
    with client(server).with_options(max_retries=0) as c:
        voices = c.get("/audio/voices", cast_to=object)
    assert "vivian" in {v["name"] for v in voices["voices"]}
    assert "english" in voices["languages"]


def test_sdk_whole_wav_equals_the_grpc_audio(server, reference: bytes) -> None:
    r = client(server).audio.speech.create(model="tts-1", voice="vivian", input=TEXT,
                                           response_format="wav",
                                           extra_body={**EXTRA, "stream": False})
    with wave.open(io.BytesIO(r.content)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        assert w.getnframes() * 2 == len(reference)  # exact sizes in the header
        assert w.readframes(w.getnframes()) == reference


def test_sdk_streamed_wav_has_a_streaming_header_then_the_audio(server,
                                                                reference: bytes) -> None:
    data = client(server).audio.speech.create(model="tts-1", voice="vivian", input=TEXT,
                                              response_format="wav", extra_body=EXTRA).content
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    assert data[36:44] == b"data\xff\xff\xff\xff"  # length unknown while streaming
    with wave.open(io.BytesIO(data)) as w:  # a standard reader takes it, to EOF
        assert w.getframerate() == 24000 and w.readframes(1 << 30) == reference


def test_sdk_streaming_response_delivers_pcm_in_pieces(server, reference: bytes) -> None:
    chunks, times = [], []
    t0 = time.perf_counter()
    with client(server).audio.speech.with_streaming_response.create(
            model="preset:tiny", voice="vivian", input=TEXT, response_format="pcm",
            extra_body=EXTRA) as r:
        assert r.headers["content-type"] == "audio/pcm"
        assert float(r.headers["x-tts-ttfa-ms"]) > 0
        for chunk in r.iter_bytes(chunk_size=None):
            chunks.append(chunk)
            times.append(time.perf_counter() - t0)
    assert b"".join(chunks) == reference
    # Streamed as made, a write per packet: the first (one codec frame, 80 ms) alone, but
    # for its last 20 ms, held until the next packet shows it was not the utterance's last.
    assert len(chunks) >= 3, [len(c) for c in chunks]
    assert len(chunks[0]) == 3840 - 960, [len(c) for c in chunks]


def test_sse_deltas_decode_to_the_same_audio(server, reference: bytes) -> None:
    body = client(server).audio.speech.create(
        model="tts-1", voice="vivian", input=TEXT, response_format="pcm",
        extra_body={**EXTRA, "stream_format": "sse"}).content.decode()
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == reference
    done = events[-1]
    assert done["type"] == "speech.audio.done" and len(deltas) == len(events) - 1
    assert done["usage"]["output_tokens"] == len(reference) // 3840
    assert done["usage"]["input_tokens"] > 5


def test_sample_rate_and_split_utf8_text(server) -> None:
    pcm = client(server).audio.speech.create(
        model="tts-1", voice="vivian", input="你好，世界。Hello.", response_format="pcm",
        extra_body={**EXTRA, "sample_rate": 16000}).content
    assert len(pcm) == FRAMES * 1280 * 2  # 80 ms at 16 kHz a frame


JSON = {"Content-Type": "application/json"}


async def post(server, body: object, raw: bytes | None = None
               ) -> tuple[int, dict, dict]:
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/speech"
    data = raw if raw is not None else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=JSON) as r:
        return r.status, dict(r.headers), await r.json()


BAD = [  # (body, status, error param, words in the message)
    ({"voice": "vivian"}, 400, "input", "Field required"),
    ({"input": "Hi", "voice": "vivian", "temperature": 1}, 400, "temperature", "xtra"),
    ({"input": "Hi", "voice": "vivian", "speed": 1.5}, 400, "speed", "only 1.0"),
    ({"input": "Hi", "voice": "vivian", "response_format": "mp3"}, 400, "response_format",
     "encode on the client"),
    ({"input": "Hi", "voice": "vivian", "response_format": "ogg"}, 400, "response_format",
     "use pcm or wav"),
    ({"input": "  ", "voice": "vivian"}, 400, "input", "empty"),
    ({"input": "Hi", "voice": "vivian", "sample_rate": 44100}, 400, None, "sample_rate 44100"),
    ({"input": "Hi", "voice": "vivian", "sampling": {"top_p": 3}}, 400, None, "top_p"),
    ({"input": "Hi", "voice": "vivian", "stream": False, "stream_format": "sse"}, 400,
     "stream", "cannot be"),
    ({"input": "Hi", "voice": "alloy"}, 404, None, "unknown voice 'alloy'"),
    ({"input": "Hi", "voice": "vivian", "language": "klingon"}, 404, None, "unknown language"),
    ({"input": "Hi", "voice": "vivian", "model": "gpt-9"}, 404, "model", "unknown model"),
    ({"input": "x" * 4001, "voice": "vivian"}, 413, "input", "limit is 4000"),
    # what got a 500 before (issue 37): out of the proto's ranges, text that is not Unicode
    ({"input": "Hi", "voice": "\ud800"}, 400, "voice", "not valid Unicode"),
    ({"input": "Hi \udfff", "voice": "vivian"}, 400, "input", "not valid Unicode"),
    ({"input": "Hi", "voice": "vivian", "seed": -1}, 400, "seed", "greater than or equal"),
    ({"input": "Hi", "voice": "vivian", "seed": 2**64}, 400, "seed", "less than or equal"),
    ({"input": "Hi", "voice": "vivian", "sample_rate": -1}, 400, "sample_rate", "greater"),
    ({"input": "Hi", "voice": "vivian", "sample_rate": 2**32}, 400, "sample_rate", "less"),
    ({"input": "Hi", "voice": "vivian", "sample_rate": 2**70}, 400, "sample_rate", "less"),
    ({"input": "Hi", "voice": "vivian", "sampling": {"top_k": 2**32}}, 400, "sampling.top_k",
     "less than or equal"),
    ({"input": "Hi", "voice": "vivian", "sampling": {"top_k": 2**64}}, 400, "sampling.top_k",
     "less than or equal"),
    ({"input": "Hi", "voice": "vivian", "sampling": {"max_frames": 2**40}}, 400,
     "sampling.max_frames", "less than or equal"),
    # a cap past the engine's held an engine slot for minutes (the random-input run)
    ({"input": "Hi", "voice": "vivian", "sampling": {"max_frames": 2**31}}, 400, None,
     "over the limit of 2047"),
    ({"input": "Hi", "voice": "vivian", "sampling": {"temperature": float("inf")}}, 400,
     "sampling.temperature", "finite"),
]

NOT_JSON = [  # (raw body, words in the message): all 400 invalid_json
    (b"{not json", "Expecting property name"),
    (b'"a string"', "JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested over"),
    (b'{"input": "Hi", "voice": "vivian", "sampling": ' + b'{"a": ' * 5000 + b"1"
     + b"}" * 5001, "nested over"),
    (b'{"input": "Hi", "voice": "vivian", "seed": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"input": "\xff\xfe"}', "utf-8"),
]


@pytest.mark.parametrize(("body", "status", "param", "words"), BAD)
async def test_bad_requests_get_their_status_and_an_openai_error(
        server, body: dict, status: int, param: str | None, words: str) -> None:
    got, _, err = await post(server, body)
    assert got == status, err
    e = err["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert words in e["message"] and e["param"] == param
    assert e["type"] == "invalid_request_error"


@pytest.mark.parametrize(("raw", "words"), NOT_JSON)
async def test_bodies_that_are_not_our_json_get_400(server, raw: bytes, words: str) -> None:
    status, _, err = await post(server, None, raw=raw)
    assert status == 400 and err["error"]["code"] == "invalid_json", err
    assert words in err["error"]["message"], err


async def test_framework_errors_are_openai_bodies_too(server) -> None:
    base = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession() as s:
        for method, path, status in (("GET", "/v1/audio/speech", 405),
                                     ("POST", "/v1/nothing", 404)):
            async with s.request(method, base + path) as r:
                assert r.status == status
                assert (await r.json())["error"]["type"] == "invalid_request_error"


async def test_oversized_bodies(server) -> None:
    status, _, err = await post(server, None, raw=b'{"input": "' + b"x" * (2 << 20) + b'"}')
    assert status == 413 and err["error"]["code"] == "request_too_large"


def test_the_sdk_raises_its_own_errors(server) -> None:
    c = client(server, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown voice"):
        c.audio.speech.create(model="tts-1", voice="alloy", input="Hi")
    with pytest.raises(openai.BadRequestError, match="speed"):
        c.audio.speech.create(model="tts-1", voice="vivian", input="Hi", speed=2.0)


async def test_at_capacity_429_with_retry_after_then_served(make_server) -> None:
    srv = make_server(TTS_MAX_SESSIONS="1")
    ws_url = f"http://127.0.0.1:{srv.http_port}/v1/audio/speech/stream"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url) as ws:  # holds the one slot
            await ws.send_json({"type": "config", "voice": "vivian"})
            assert (await ws.receive_json())["type"] == "started"
            status, headers, err = await post(srv, {"input": "Hi", "voice": "vivian"})
            assert status == 429 and headers["Retry-After"] == "1", err
            assert err["error"]["type"] == "rate_limit_error"
            assert "limit of 1 open streams" in err["error"]["message"]
        for _ in range(50):  # the slot frees once the socket is gone
            body = {"input": "Hi there.", "voice": "vivian", "sampling": {"max_frames": 2}}
            status = (await post_audio(srv, body))[0]
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
    assert srv.metric('tts_admission_rejected_total{protocol="http"}') == 1
    assert srv.metric('tts_requests_total{protocol="websocket"}') == 1


async def test_bursts_at_capacity_get_429_and_during_a_drain_503(make_server) -> None:
    """Requests that come together get the status a retrying client needs, every one:
    429 while the server is full, 503 while it drains (never 500), with Retry-After."""
    srv = make_server(TTS_MAX_SESSIONS="1", TTS_DRAIN_TIMEOUT_S="30")
    ws_url = f"http://127.0.0.1:{srv.http_port}/v1/audio/speech/stream"
    body = {"input": "Hi there.", "voice": "vivian"}
    # The socket holds the one slot, and the drain open.
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json({"type": "config", "voice": "vivian"})
        assert (await ws.receive_json())["type"] == "started"
        got = await asyncio.gather(*(post(srv, body) for _ in range(40)))
        assert {(st, h.get("Retry-After"), e["error"]["code"]) for st, h, e in got} == {
            (429, "1", "resource_exhausted")}
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        got = await asyncio.gather(*(post(srv, body) for _ in range(40)))
        assert {(st, h.get("Retry-After"), e["error"]["code"]) for st, h, e in got} == {
            (503, "1", "unavailable")}
        assert "draining" in got[0][2]["error"]["message"]
    assert srv.proc.wait(30) == 0


async def post_audio(server, body: dict) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/speech"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.read()


async def test_a_client_that_leaves_mid_stream_frees_its_session(server) -> None:
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/speech"
    body = {"input": TEXT * 3, "voice": "vivian", "response_format": "pcm",
            "sampling": {"max_frames": 600}}
    before = server.metric('tts_utterances_total{protocol="http",reason="cancelled"}')
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        await r.content.readexactly(3840)  # the first packet, then we go
    deadline = time.monotonic() + 10
    while server.metric('tts_active_sessions{protocol="http"}') and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert server.metric('tts_active_sessions{protocol="http"}') == 0
    assert server.metric('tts_utterances_total{protocol="http",reason="cancelled"}') == before + 1
    # Counted under its own protocol, beside gRPC's.
    assert server.metric('tts_ttfa_seconds_count{protocol="http"}') >= 1


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_an_engine_fault_mid_stream_truncates_the_body(make_server,
                                                             stream_format: str) -> None:
    """After 200 went out a failure cannot change the status: the audio stream is cut
    (no final chunk: the client sees an incomplete body, not a short complete file), an
    sse stream ends with an error event."""
    srv = make_server(TTS_TEST_FAULT="bug@6")  # the engine's fault hook (engine/faults.py)
    url = f"http://127.0.0.1:{srv.http_port}/v1/audio/speech"
    # greedy and seeded: an utterance that runs past the fault's step (sampled, the tiny
    # random model can end it at EOS first, and the stream then ends cleanly)
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm",
            "stream_format": stream_format, **EXTRA,
            "sampling": {"greedy": True, "max_frames": 40}}
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        if stream_format == "audio":
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        else:
            events = [json.loads(line[6:]) for line in (await r.text()).splitlines()
                      if line.startswith("data: ")]
            assert events[0]["type"] == "speech.audio.delta"
            assert events[-1]["type"] == "error", events[-1]
            assert "synthesis failed" in events[-1]["error"]["message"]
    assert srv.metric('tts_errors_total{code="INTERNAL",protocol="http"}') == 1
    assert srv.proc.poll() is None
