"""Every bad input to POST /api/token gets a 4xx with a message that says what to fix,
and no token; the answers are counted in token_requests_total{status}."""

from __future__ import annotations

import json

import pytest

ROOM_RULE = "letters, digits"


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


BAD = [
    # (id, body bytes, status, substring of the message, field)
    ("empty", b"", 400, "empty body", None),
    ("not-json", b"{room: demo", 400, "not valid JSON", None),
    ("not-utf8", b'{"room": "\xff"}', 400, "not valid JSON", None),
    # a 500 before (issue 37)
    ("deep", b"[" * 2000 + b"]" * 2000, 400, "nested too deep", None),
    ("deep-field", b'{"room": ' + b"[" * 1500 + b"]" * 1500 + b"}", 400, "nested too deep",
     None),
    ("name-surrogate", b'{"room": "demo", "identity": "a", "name": "\\ud800"}', 400,
     "control characters", "name"),
    ("array", b'["demo", "alice"]', 400, "must be a JSON object, got array", None),
    ("string", b'"demo"', 400, "must be a JSON object, got string", None),
    ("missing-room", _body(identity="alice"), 400, "missing field 'room'", "room"),
    ("missing-identity", _body(room="demo"), 400, "missing field 'identity'", "identity"),
    ("null-room", _body(room=None, identity="alice"), 400, "missing field 'room'", "room"),
    ("room-number", _body(room=7, identity="alice"), 400, "'room' must be a string, got number",
     "room"),
    ("room-object", _body(room={}, identity="a"), 400, "must be a string, got object", "room"),
    ("identity-bool", _body(room="demo", identity=True), 400, "got boolean", "identity"),
    ("room-empty", _body(room="", identity="alice"), 400, "invalid room", "room"),
    ("room-space", _body(room="my room", identity="alice"), 400, ROOM_RULE, "room"),
    ("room-slash", _body(room="a/../b", identity="alice"), 400, "invalid room", "room"),
    ("room-unicode", _body(room="zimmer-ö", identity="alice"), 400, "invalid room", "room"),
    ("room-leading-dash", _body(room="-x", identity="alice"), 400, "starting with", "room"),
    ("room-65", _body(room="r" * 65, identity="alice"), 400, "1-64 characters", "room"),
    ("identity-newline", _body(room="demo", identity="al\nice"), 400, "invalid identity",
     "identity"),
    ("identity-65", _body(room="demo", identity="i" * 65), 400, "invalid identity", "identity"),
    ("name-number", _body(room="demo", identity="a", name=1), 400, "'name' must be a string",
     "name"),
    ("name-long", _body(room="demo", identity="a", name="n" * 65), 400, "longer than 64",
     "name"),
    ("name-control", _body(room="demo", identity="a", name="x\u0007y"), 400,
     "control characters", "name"),
    ("unknown-field", _body(rom="demo", room="d", identity="a"), 400, "unknown field 'rom'",
     "rom"),
    ("too-large", _body(room="demo", identity="a", pad="x" * 5000), 413, "body too large", None),
]


@pytest.mark.parametrize(("body", "status", "message", "field"),
                         [b[1:] for b in BAD], ids=[b[0] for b in BAD])
async def test_bad_body(client_for, body: bytes, status: int, message: str,  # type: ignore[no-untyped-def]
                        field: str | None) -> None:
    client = await client_for(token_rate_limit_burst=1000)
    resp = await client.post("/api/token", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == status
    out = await resp.json()
    assert message in out["error"], out
    assert out.get("field") == field
    assert "participant_token" not in out


async def test_wrong_content_type_is_415(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    resp = await client.post("/api/token", data=_body(room="demo", identity="a"),
                             headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert "application/json" in (await resp.json())["error"]


async def test_get_is_405(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    resp = await client.get("/api/token")
    assert resp.status == 405


async def test_edges_that_are_valid(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    for body in (
        {"room": "r" * 64, "identity": "i" * 64},
        {"room": "a.b_c-1", "identity": "user.42_x-y", "name": "Zoë 👋"},
        {"room": "demo", "identity": "alice", "name": "   "},  # blank name = no name
    ):
        resp = await client.post("/api/token", json=body)
        assert resp.status == 200, await resp.text()


async def test_answers_are_counted_by_status(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    await client.post("/api/token", json={"room": "demo", "identity": "a"})
    await client.post("/api/token", json={"room": "demo"})
    await client.post("/api/token", json={"room": "demo"})
    text = await (await client.get("/metrics")).text()
    assert 'token_requests_total{status="200"} 1.0' in text
    assert 'token_requests_total{status="400"} 2.0' in text
    assert "token_request_duration_seconds_count 3.0" in text
