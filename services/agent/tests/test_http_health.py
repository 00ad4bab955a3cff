"""The agent's /healthz: the body every service answers (`status` SERVING / NOT_SERVING
matching the HTTP code), plus whether each backend's gRPC channel connects.

The backend here is a real gRPC server with no services: /healthz only checks that the
channel connects. The down backend is a closed port.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from voice_agent.http import make_app
from voice_agent.settings import AgentSettings
from voice_agent.talk import hub as talk_hub


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def backend_addr() -> AsyncIterator[str]:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.fixture(autouse=True)
def quiet_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load monitor of its own, unsampled: a busy test host is not what these test."""
    from voice_agent import http
    from voice_agent.load import LoadMonitor

    quiet = LoadMonitor()
    monkeypatch.setattr(quiet, "watch", lambda: None)
    monkeypatch.setattr(http, "MONITOR", quiet)


async def healthz(tts_addr: str, thinker_addr: str, query: str = "") -> tuple[int, dict]:
    settings = AgentSettings(tts_addr=tts_addr, thinker_addr=thinker_addr, http_port=0,
                             ws_max_sessions=0)  # no talk route: nothing to prepare
    async with TestClient(TestServer(make_app(settings))) as client:
        r = await client.get("/healthz" + query)
        return r.status, await r.json()


async def test_both_backends_up_is_serving(backend_addr: str) -> None:
    for query in ("", "?strict=1"):
        assert await healthz(backend_addr, backend_addr, query) == (
            200, {"status": "SERVING", "tts": True, "thinker": True, "degraded": False,
                  "preparing": False, "overloaded": False})


async def test_a_down_backend_is_degraded_and_not_serving_when_strict(
        backend_addr: str) -> None:
    down = f"127.0.0.1:{closed_port()}"
    assert await healthz(backend_addr, down) == (
        200, {"status": "SERVING", "tts": True, "thinker": False, "degraded": True,
              "preparing": False, "overloaded": False})
    assert await healthz(down, backend_addr, "?strict=1") == (
        503, {"status": "NOT_SERVING", "tts": False, "thinker": True, "degraded": True,
              "preparing": False, "overloaded": False})


async def test_not_serving_until_the_talk_route_is_prepared(backend_addr: str,
                                                             monkeypatch) -> None:
    """The starter phrases come before SERVING; a TTS that never answers is given up on
    (PREPARE_TIMEOUT_S) and the agent serves, degraded: conversations speak them live."""
    monkeypatch.setattr(talk_hub, "PREPARE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(talk_hub, "PREPARE_RETRY_S", 0.2)
    down = f"127.0.0.1:{closed_port()}"
    settings = AgentSettings(tts_addr=down, thinker_addr=backend_addr, http_port=0)
    app = make_app(settings)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/healthz")
        assert (r.status, (await r.json())["preparing"]) == (503, True)
        await asyncio.wait_for(app[talk_hub.TALK_HUB].ready.wait(), 30)
        r = await client.get("/healthz")
        assert r.status == 200 and await r.json() == {
            "status": "SERVING", "tts": False, "thinker": True, "degraded": True,
            "preparing": False, "overloaded": False}



async def test_an_overloaded_process_says_so_and_keeps_serving(
        backend_addr: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running late (load.py) refuses new /v1/talk conversations, not the probes: the
    conversations under way go on."""
    from voice_agent import http
    from voice_agent.load import LoadMonitor

    late = LoadMonitor()
    for _ in range(20):
        late.record(0.2)
    monkeypatch.setattr(http, "MONITOR", late)
    status, body = await healthz(backend_addr, backend_addr)
    assert status == 200 and body["overloaded"] is True and body["status"] == "SERVING"
