"""The Origin rule of `/v1/talk` and `/v1/realtime` (`Door.origin_allowed`), without
servers: the agent's own host counts as same-origin only where the name is one it knows
(a loopback name, an IP literal, a host in AGENT_WS_ORIGINS); a DNS-rebinding page
(evil.example resolved to 127.0.0.1: its Origin and the Host both evil.example) is
refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiohttp.test_utils import make_mocked_request
from voice_agent.conversation.door import Door


@pytest.mark.parametrize(("origin", "host", "ws_origins", "ok"), [
    ("http://evil.example:8080", "evil.example:8080", "", False),  # DNS rebinding
    ("http://evil.example:8000", "evil.example:8080", "", False),
    ("http://127.0.0.1:8000", "127.0.0.1:8080", "", True),  # the mesh's page, next door
    ("http://localhost:8000", "127.0.0.1:8080", "", True),
    ("http://192.168.1.20:8000", "192.168.1.20:8080", "", True),  # the host's IP
    ("http://[::1]:8000", "[::1]:8080", "", True),
    ("https://voice.example.com", "voice.example.com", "https://voice.example.com", True),
    ("https://voice.example.com:8443", "voice.example.com:8443",
     "https://voice.example.com", True),  # a configured name, another port
    ("https://evil.example", "127.0.0.1:8080", "", False),
    ("https://any.example", "any.example", "*", True),
])
def test_same_origin_only_for_the_agents_own_names(origin: str, host: str, ws_origins: str,
                                                    ok: bool) -> None:
    door = SimpleNamespace(settings=SimpleNamespace(ws_origins=ws_origins))
    request = make_mocked_request("GET", "/v1/talk", headers={"Origin": origin, "Host": host})
    assert Door.origin_allowed(door, request) is ok  # type: ignore[arg-type]
