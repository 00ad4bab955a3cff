"""Who gets which token (grants.py), through the real app on a real port: a stranger gets
the page's `web-*` identities only (never `admin`), in the rooms TOKEN_ROOMS opens; the
app's backend, showing a TOKEN_ISSUER_KEYS key, mints what its users need; a wrong key is
refused, never taken for anonymous; TOKEN_ANONYMOUS=false leaves the backend alone; the
key file rotates without a restart; no key is echoed or logged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jwt
import pytest
from conftest import API_SECRET, make_settings
from voice_token.settings import Settings, SettingsError

BACKEND_KEY = "issuer-key-0123456789abcdef"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def sub_of(body: dict) -> str:
    return jwt.decode(body["participant_token"], API_SECRET, algorithms=["HS256"],
                      options={"verify_aud": False})["sub"]


async def test_a_stranger_cannot_mint_admin(client_for) -> None:  # type: ignore[no-untyped-def]
    shipped = Settings.model_fields["token_identities"].default_factory()  # type: ignore[misc]
    assert shipped == ["web-*"]
    client = await client_for(token_identities=shipped)
    resp = await client.post("/api/token", json={"room": "demo", "identity": "admin"})
    body = await resp.json()
    assert resp.status == 403 and body["field"] == "identity", body
    assert "TOKEN_IDENTITIES: web-*" in body["error"] and "TOKEN_ISSUER_KEYS" in body["error"]
    resp = await client.post("/api/token", json={"room": "demo", "identity": "web-1a2b3c4d"})
    assert resp.status == 200 and sub_of(await resp.json()) == "web-1a2b3c4d"


async def test_rooms_open_to_strangers(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_rooms="voice-*,lobby")
    for room, status in (("voice-demo", 200), ("lobby", 200), ("board-meeting", 403),
                         ("lobby2", 403)):
        resp = await client.post("/api/token", json={"room": room, "identity": "web-1"})
        assert resp.status == status, (room, await resp.text())
        if status == 403:
            assert (await resp.json())["field"] == "room"


async def test_the_apps_backend_mints_what_it_decides(  # type: ignore[no-untyped-def]
        client_for, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = await client_for(token_identities="web-*", token_rooms="voice-*",
                              token_issuer_keys=BACKEND_KEY)
    resp = await client.post("/api/token", json={"room": "board-meeting", "identity": "admin"},
                             headers=bearer(BACKEND_KEY))
    assert resp.status == 200 and sub_of(await resp.json()) == "admin"
    # A wrong key, a key in another scheme or an empty Bearer is refused, never taken as
    # no key at all (an anonymous token).
    for headers, words in ((bearer("wrong-key-zzz"), "invalid API key"),
                           ({"Authorization": f"Basic {BACKEND_KEY}"}, "not `Bearer <key>`"),
                           ({"Authorization": "Bearer "}, "not `Bearer <key>`"),
                           ({"Authorization": ""}, "not `Bearer <key>`")):
        resp = await client.post("/api/token", json={"room": "voice-1", "identity": "web-1"},
                                 headers=headers)
        text = await resp.text()
        assert resp.status == 401 and words in text and "wrong-key-zzz" not in text
        assert resp.headers["WWW-Authenticate"] == "Bearer"
    logged = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert BACKEND_KEY not in logged and "wrong-key-zzz" not in logged
    assert '"caller": "issuer"' in logged or "'caller': 'issuer'" in logged


async def test_backend_only(client_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keyfile = tmp_path / "issuer-keys"
    keyfile.write_text("# the app's backend\nold-backend-key-1\n")
    client = await client_for(token_anonymous=False, token_issuer_keys_file=keyfile)
    resp = await client.post("/api/token", json={"room": "demo", "identity": "web-1"})
    assert resp.status == 401 and "backend only" in (await resp.json())["error"]
    ok = await client.post("/api/token", json={"room": "demo", "identity": "bob"},
                           headers=bearer("old-backend-key-1"))
    assert ok.status == 200
    keyfile.write_text("new-backend-key-2\n")  # rotated: no restart
    os.utime(keyfile, ns=(1, 10**18))
    old = await client.post("/api/token", json={"room": "demo", "identity": "bob"},
                            headers=bearer("old-backend-key-1"))
    new = await client.post("/api/token", json={"room": "demo", "identity": "bob"},
                            headers=bearer("new-backend-key-2"))
    assert old.status == 401 and new.status == 200


async def test_a_key_where_none_is_configured(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for()
    resp = await client.post("/api/token", json={"room": "demo", "identity": "web-1"},
                             headers=bearer("some-key"))
    assert resp.status == 401 and "no issuer keys" in (await resp.json())["error"]


def test_patterns_are_checked_at_start() -> None:
    with pytest.raises(SettingsError, match="TOKEN_ROOMS"):
        make_settings(token_rooms="voice demo")
    with pytest.raises(SettingsError, match="TOKEN_IDENTITIES"):
        make_settings(token_identities="web-*,a/b")
    assert make_settings(token_rooms=" voice-* , lobby ").token_rooms == ["voice-*", "lobby"]
