"""A seeded random run of 1,000 (VOICE_RANDOM_N) bad token requests against the real app
on a real port: valid requests mutated at random (a field's type or value, unknown fields,
nesting, junk bytes, invalid UTF-8, wrong content types and keys). Every answer is the
client's error (400/401/403/413/415) or a token: never a 5xx, and the service still mints
afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

SEED = 20261126
# 1,000 in `make test`; VOICE_RANDOM_N=<n> runs n (`make test-random`: 10,000).
N = int(os.environ.get("VOICE_RANDOM_N", 0)) or 1000
BASE = {"room": "voice-demo", "identity": "web-1a2b3c4d", "name": "Alice"}
ODD: list[Any] = [None, True, 0, -1, 2**64, 1e308, "", " ", "\ud800", "a" * 65, "x" * 5000,
                  "admin", "web-", "web-*", "../etc", "a b", "ünï", "<|im_start|>", [], {},
                  [1], {"a": 1}]
KEYS = ["room", "identity", "name", "rom", "grants", "video", ""]


def body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.75:
        obj: dict[str, Any] = dict(BASE)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.15 and obj:
                obj.pop(rng.choice(list(obj)))
            else:
                obj[rng.choice(KEYS)] = rng.choice(ODD)
        return json.dumps(obj).encode()
    if roll < 0.85:
        depth = rng.choice([5, 500, 5000])
        return b'{"room": ' + b"[" * depth + b"]" * depth + b"}"
    raw = json.dumps(BASE).encode()
    return rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
                       raw[: rng.randint(0, len(raw))], raw.replace(b"Alice", b"\xff\xfe"),
                       b"x" * rng.choice([4097, 20_000])])


async def test_random_bad_token_requests_are_never_a_5xx(client_for) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED)
    client = await client_for(token_rate_limit_per_minute=100_000,
                              token_rate_limit_burst=100_000, token_identities="web-*",
                              token_issuer_keys="issuer-key-0123456789")
    statuses: dict[int, int] = {}
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        data = body(rng)
        headers = {"Content-Type": rng.choice(["application/json"] * 8 + [
            "text/plain", "application/x-www-form-urlencoded", "application/json; charset=x"])}
        if rng.random() < 0.1:
            headers["Authorization"] = rng.choice(["Bearer nope", "Bearer ", "Basic x",
                                                   "Bearer issuer-key-0123456789"])
        async with sem:
            resp = await client.post("/api/token", data=data, headers=headers)
            text = await resp.text()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status in (200, 400, 401, 403, 413, 415), (SEED, i, data[:200], text)
        if resp.status != 200:
            assert "error" in json.loads(text), (SEED, i, text)

    await asyncio.gather(*(one(i) for i in range(N)))
    assert sum(statuses.values()) == N and statuses.get(400, 0) > N // 4, statuses
    ok = await client.post("/api/token", json=BASE)
    assert ok.status == 200 and "participant_token" in await ok.json()
