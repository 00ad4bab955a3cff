"""A seeded random run of bad input at each door of a real server: 1,000 HTTP requests,
1,000 WebSocket sessions, 1,000 gRPC calls (VOICE_RANDOM_N=10000: ~2.5 minutes), each a valid
request mutated at random (a field's type, a value out of range, text that is not
Unicode, nesting, junk bytes, an unknown field...). Whatever comes in, the answer is the
client's error (4xx / close 1008 / 1009 / INVALID_ARGUMENT / NOT_FOUND...) or audio: never
a 5xx, 1011, INTERNAL or UNKNOWN, and the server still serves afterwards. The seed is
printed with any failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from typing import Any

import aiohttp
import grpc
from voice.tts.v1 import tts_pb2

from .conftest import config

SEED = 20261126
# 1,000 at every door in `make test`; VOICE_RANDOM_N=<n> runs n (`make test-random`: 10,000).
HTTP_N = WS_N = GRPC_N = int(os.environ.get("VOICE_RANDOM_N", 0)) or 1000
BASE: dict[str, Any] = {"model": "tts-1", "input": "Hi.", "voice": "vivian",
                        "response_format": "pcm", "stream": False, "seed": 1,
                        "sampling": {"greedy": True, "max_frames": 1}}
ODD_VALUES: list[Any] = [
    None, True, -1, 0, 2**31, 2**32, 2**63, 2**64, 2**70, -2**64, 1e308, -1e308, 0.5,
    "", " ", "\ud800", "x" * 5000, "<|im_start|>", "ünïcödé", [], [1, 2], {}, {"a": 1},
]
ODD_KEYS = ["input", "voice", "model", "language", "instructions", "sample_rate", "seed",
            "speed", "response_format", "stream", "stream_format", "sampling", "unknown",
            "temperature"]
SAMPLING_KEYS = ["greedy", "temperature", "top_k", "top_p", "repetition_penalty",
                 "max_frames", "nope"]


def mutate(rng: random.Random, base: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            sampling = obj.setdefault("sampling", {})
            if isinstance(sampling, dict):
                sampling[rng.choice(SAMPLING_KEYS)] = rng.choice(ODD_VALUES)
        elif rng.random() < 0.1 and obj:
            obj.pop(rng.choice(list(obj)))
        else:
            obj[rng.choice(ODD_KEYS)] = rng.choice(ODD_VALUES)
    # a request that turned valid speaks one frame, not the server's cap (a run's time)
    sampling = obj.get("sampling")
    if sampling is None:
        obj["sampling"] = {"max_frames": 1}
    elif isinstance(sampling, dict) and sampling.get("max_frames") in (None, 0, False):
        sampling["max_frames"] = 1
    return obj


def body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.75:
        return json.dumps(mutate(rng, BASE)).encode()
    if roll < 0.85:  # nesting
        depth = rng.choice([5, 50, 900, 3000])
        return (b'{"input": "Hi", "voice": "vivian", "sampling": ' + b'{"a": ' * depth
                + b"1" + b"}" * (depth + 1))
    if roll < 0.95:  # junk: random bytes, truncated JSON, invalid UTF-8
        raw = json.dumps(BASE).encode()
        return rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
                           raw[: rng.randint(0, len(raw))], raw.replace(b"Hi", b"\xff\xfe")])
    return b'{"input": "Hi", "voice": "vivian", "seed": ' + b"9" * rng.choice([20, 5000]) + b"}"


async def test_http_random_bad_input_is_never_a_5xx(server) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED)
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/speech"
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession() as s:
        sem = asyncio.Semaphore(8)

        async def one(i: int, data: bytes) -> None:
            async with sem, s.post(url, data=data,
                                   headers={"Content-Type": "application/json"}) as r:
                payload = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                assert r.status < 500, (SEED, i, data[:300], r.status, payload[:300])
                if r.status >= 400:
                    err = json.loads(payload)["error"]
                    assert set(err) == {"message", "type", "param", "code"}, (i, err)

        await asyncio.gather(*(one(i, body(rng)) for i in range(HTTP_N)))
        print(f"\nHTTP statuses over {HTTP_N}: {dict(sorted(statuses.items()))}")
        assert statuses.get(200, 0) > 0 and sum(statuses.values()) == HTTP_N
        async with s.post(url, json=BASE) as r:  # still serving
            assert r.status == 200 and len(await r.read()) > 0


def ws_messages(rng: random.Random) -> list[str | bytes]:
    cfg = {"type": "config", "voice": "vivian", "sampling": {"max_frames": 1}}
    roll = rng.random()
    if roll < 0.4:
        first: str | bytes = json.dumps(mutate(rng, cfg))
    elif roll < 0.5:
        first = "[" * rng.choice([10, 3000]) + "]" * 10
    elif roll < 0.6:
        first = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    else:
        first = json.dumps(cfg)
    rest: list[str | bytes] = [rng.choice([
        json.dumps({"type": "text", "text": rng.choice(["Hi.", "\ud800", "", 7, None])}),
        json.dumps({"type": rng.choice(["flush", "stop", "reset", "dance", 3])}),
        b"\xff\xfe", b"Hi.", json.dumps(cfg), "{not json",
    ]) for _ in range(rng.randint(0, 3))]
    return [first, *rest, json.dumps({"type": "end"})]


async def test_websocket_random_bad_input_never_closes_1011(server) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED + 1)
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/speech/stream"
    codes: dict[int | None, int] = {}
    async with aiohttp.ClientSession() as s:
        sem = asyncio.Semaphore(8)

        async def one(i: int, msgs: list[str | bytes]) -> None:
            async with sem, s.ws_connect(url) as ws:
                for m in msgs:
                    if ws.closed:
                        break
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await (ws.send_bytes(m) if isinstance(m, bytes) else ws.send_str(m))
                async for _ in ws:
                    pass
                codes[ws.close_code] = codes.get(ws.close_code, 0) + 1
                assert ws.close_code in (1000, 1008, 1009), (SEED + 1, i, msgs, ws.close_code)

        await asyncio.gather(*(one(i, ws_messages(rng)) for i in range(WS_N)))
    print(f"\nWebSocket close codes over {WS_N}: {codes}")
    assert codes.get(1000, 0) > 0 and codes.get(1008, 0) > 0


CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION}


def grpc_requests(rng: random.Random) -> list[bytes]:
    good = config(sampling={"max_frames": 1})
    roll = rng.random()
    if roll < 0.3:
        cfg = tts_pb2.SessionConfig()
        cfg.CopyFrom(good)
        for name, values in (("voice", ["", "nobody", "x" * 300]),
                             ("language", ["klingon", ""]), ("sample_rate", [1, 44100, 2**32 - 1]),
                             ("frame_ms", [3, 2**31]), ("frames_per_message", [0, 17, 2**31])):
            if rng.random() < 0.3:
                setattr(cfg, name, rng.choice(values))
        first = tts_pb2.SynthesizeRequest(config=cfg).SerializeToString()
    elif roll < 0.5:
        first = bytes(rng.randrange(256) for _ in range(rng.randint(0, 48)))
    elif roll < 0.6:
        first = tts_pb2.SynthesizeRequest(
            text=tts_pb2.TextDelta(text="Hi")).SerializeToString()
    else:
        first = tts_pb2.SynthesizeRequest(config=good).SerializeToString()
    rest = [rng.choice([
        tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text="Hi.")).SerializeToString(),
        tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(utf8=b"\xff\xfe")).SerializeToString(),
        tts_pb2.SynthesizeRequest(config=good).SerializeToString(),
        tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=rng.choice([0, 1, 2, 3, 99])))
        .SerializeToString(),
        b"\x0a\xff\xff\xff",
    ]) for _ in range(rng.randint(0, 3))]
    return [first, *rest]


async def test_grpc_random_bad_input_is_never_internal_or_unknown(server) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED + 2)
    codes: dict[str, int] = {}
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = ch.stream_stream("/voice.tts.v1.TextToSpeech/Synthesize",
                                request_serializer=lambda b: b,
                                response_deserializer=tts_pb2.SynthesizeResponse.FromString)
        sem = asyncio.Semaphore(8)

        async def one(i: int, msgs: list[bytes]) -> None:
            async with sem:
                async def reqs():  # type: ignore[no-untyped-def]
                    for m in msgs:
                        yield m

                try:
                    async for _ in call(reqs()):
                        pass
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as e:
                    code = e.code()
                codes[code.name] = codes.get(code.name, 0) + 1
                assert code in CLIENT_CODES, (SEED + 2, i, msgs, code)

        await asyncio.gather(*(one(i, grpc_requests(rng)) for i in range(GRPC_N)))
    print(f"\ngRPC codes over {GRPC_N}: {codes}")
    assert codes.get("OK", 0) > 0 and codes.get("INVALID_ARGUMENT", 0) > 0
