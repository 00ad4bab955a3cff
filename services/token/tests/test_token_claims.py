"""Tokens from POST /api/token, decoded and checked with livekit-api's own TokenVerifier:
grants for exactly one room, identity, name, TTL/expiry, agent dispatch; and the
verifier rejects expired, tampered, wrongly-signed and wrongly-issued tokens."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time

import jwt
import pytest
from conftest import API_KEY, API_SECRET
from livekit.api import TokenVerifier
from voice_token.tokens import TokenMinter


def _verify(token: str, **kw: object):  # type: ignore[no-untyped-def]
    return TokenVerifier(API_KEY, API_SECRET, **kw).verify(token)  # type: ignore[arg-type]


async def _issue(client, **body: object) -> dict:  # type: ignore[no-untyped-def]
    resp = await client.post("/api/token", json=body)
    assert resp.status == 200, await resp.text()
    assert resp.headers["Cache-Control"] == "no-store"
    return await resp.json()


async def test_claims_grant_join_of_that_room_only(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(livekit_url="wss://lk.example.com")
    t0 = int(time.time())
    out = await _issue(client, room="room-a", identity="alice", name="Alice Zoë")
    assert set(out) == {"server_url", "participant_token", "expires_at"}
    assert out["server_url"] == "wss://lk.example.com"

    claims = _verify(out["participant_token"])
    assert claims.identity == "alice"
    assert claims.name == "Alice Zoë"
    assert claims.kind == "standard"
    v = claims.video
    assert v is not None and v.room_join is True and v.room == "room-a"
    # Nothing beyond joining that one room: no create/list/admin/record, not hidden.
    assert not v.room_create and not v.room_list and not v.room_admin and not v.room_record
    assert not v.hidden and not v.agent and v.destination_room is None
    assert v.can_publish and v.can_subscribe and v.can_publish_data
    assert v.can_publish_sources == ["microphone"]
    assert claims.room_config is None  # no agent name configured -> no dispatch

    raw = jwt.decode(out["participant_token"], API_SECRET, algorithms=["HS256"], issuer=API_KEY)
    assert raw["exp"] - raw["nbf"] == 600  # TOKEN_TTL_SECONDS default: 10 minutes
    assert t0 - 2 <= raw["nbf"] <= int(time.time()) + 1
    expires = dt.datetime.fromisoformat(out["expires_at"].replace("Z", "+00:00"))
    assert out["expires_at"].endswith("Z")
    assert int(expires.timestamp()) == raw["exp"]


async def test_ttl_is_configurable(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_ttl_seconds=120)
    out = await _issue(client, room="r", identity="bob")
    raw = jwt.decode(out["participant_token"], options={"verify_signature": False})
    assert raw["exp"] - raw["nbf"] == 120


async def test_agent_dispatch_when_configured(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_agent_name="voice-agent")
    out = await _issue(client, room="support", identity="carol")
    claims = _verify(out["participant_token"])
    assert claims.room_config is not None
    assert [a.agent_name for a in claims.room_config.agents] == ["voice-agent"]
    assert claims.video is not None and claims.video.room == "support"


async def test_name_is_optional(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    out = await _issue(client, room="r", identity="dave")
    assert _verify(out["participant_token"]).name == ""


def test_expired_token_rejected() -> None:
    minter = TokenMinter(API_KEY, API_SECRET, dt.timedelta(seconds=1))
    token = minter.mint("r", "erin").jwt
    _verify(token, leeway=dt.timedelta(0))  # valid now
    time.sleep(2.1)
    with pytest.raises(jwt.ExpiredSignatureError):
        _verify(token, leeway=dt.timedelta(0))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_tampered_payload_rejected() -> None:
    token = TokenMinter(API_KEY, API_SECRET, dt.timedelta(minutes=10)).mint("room-a", "eve").jwt
    header, payload, sig = token.split(".")
    claims = json.loads(_unb64(payload))
    claims["video"]["room"] = "room-b"  # try to reuse the token for another room
    claims["video"]["roomAdmin"] = True
    forged = ".".join([header, _b64(json.dumps(claims).encode()), sig])
    with pytest.raises(jwt.InvalidSignatureError):
        _verify(forged)


def test_tampered_signature_and_alg_none_rejected() -> None:
    token = TokenMinter(API_KEY, API_SECRET, dt.timedelta(minutes=10)).mint("room-a", "eve").jwt
    header, payload, sig = token.split(".")
    flipped = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
    with pytest.raises(jwt.InvalidSignatureError):
        _verify(".".join([header, payload, flipped]))
    none_header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    with pytest.raises(jwt.InvalidAlgorithmError):
        _verify(f"{none_header}.{payload}.")


def test_wrong_secret_or_key_rejected() -> None:
    token = TokenMinter(API_KEY, API_SECRET, dt.timedelta(minutes=10)).mint("r", "frank").jwt
    with pytest.raises(jwt.InvalidSignatureError):
        TokenVerifier(API_KEY, "another-secret-of-sufficient-length-1234").verify(token)
    with pytest.raises(jwt.InvalidIssuerError):
        TokenVerifier("OTHERKEY", API_SECRET).verify(token)


def test_minter_repr_hides_secret() -> None:
    minter = TokenMinter(API_KEY, API_SECRET, dt.timedelta(minutes=10))
    assert API_SECRET not in repr(minter) and API_SECRET not in str(minter)
