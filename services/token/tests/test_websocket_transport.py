"""Without LiveKit (LIVEKIT_URL empty, the local mesh) the page is told to talk to the
agent's WebSocket: no credentials are needed, /api/token says why it has nothing to sign,
and the page carries the transport and the agent's URL."""

from __future__ import annotations

import pytest
from voice_token.settings import SettingsError, load_settings


def test_empty_livekit_url_means_websocket_and_needs_no_credentials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "")
    s = load_settings()
    assert s.transport == "websocket"
    assert s.token_agent_ws_url == "ws://127.0.0.1:8003/v1/talk"
    monkeypatch.setenv("TOKEN_AGENT_WS_URL", "wss://agent.example.com/v1/talk/")
    assert load_settings().token_agent_ws_url == "wss://agent.example.com/v1/talk"


def test_bad_or_missing_agent_url_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "")
    monkeypatch.setenv("TOKEN_AGENT_WS_URL", "127.0.0.1:8003")
    with pytest.raises(SettingsError, match="TOKEN_AGENT_WS_URL: Value error, must be a ws://"):
        load_settings()
    monkeypatch.setenv("TOKEN_AGENT_WS_URL", "")
    with pytest.raises(SettingsError, match="LIVEKIT_URL and TOKEN_AGENT_WS_URL are both empty"):
        load_settings()


async def test_page_and_token_endpoint_in_websocket_mode(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    from voice_token.app import build_app

    app = build_app(load_settings(livekit_url="", token_agent_ws_url="ws://127.0.0.1:9/v1/talk"))
    client = await aiohttp_client(app)
    page = await (await client.get("/")).text()
    assert 'data-transport="websocket"' in page
    assert 'data-agent-ws-url="ws://127.0.0.1:9/v1/talk"' in page
    r = await client.post("/api/token", json={"room": "r", "identity": "me"})
    assert r.status == 409
    assert "LIVEKIT_URL is empty" in (await r.json())["error"]
    assert (await (await client.get("/healthz")).json())["transport"] == "websocket"


async def test_livekit_mode_page_says_livekit(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(livekit_url="ws://127.0.0.1:7880")
    page = await (await client.get("/")).text()
    assert 'data-transport="livekit"' in page
