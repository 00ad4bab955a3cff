"""API keys on the thinker (LLM_API_KEYS, LLM_API_KEYS_FILE): Chat needs `authorization:
Bearer <key>` metadata, health stays open, the file rotates while the server runs, the CLI
client sends its --api-key, and no key reaches the log."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from conftest import make_settings, request, text_of, user
from grpc_health.v1 import health_pb2, health_pb2_grpc
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc
from voice_llm.server import ThinkerServer

INLINE, FROM_FILE, ROTATED = "thinker-inline-key-0123", "thinker-file-key-4567", "rotated-89"


@pytest_asyncio.fixture
async def keyed(cache_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[ThinkerServer, Path]]:
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"# the thinker's keys\n{FROM_FILE}\n")
    server = ThinkerServer(make_settings(cache_dir, api_keys=f"{INLINE},",
                                         api_keys_file=keyfile))
    await server.start()
    yield server, keyfile
    await server.stop()


async def ask(port: int, key: str | None) -> str:
    meta = (("authorization", f"Bearer {key}"),) if key is not None else ()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        req = request(user("Hello there"), max_tokens=4, seed=1)
        return text_of([d async for d in pb_grpc.ThinkerStub(ch).Chat(req, metadata=meta)])


async def test_chat_needs_a_key_and_health_does_not(
        keyed: tuple[ThinkerServer, Path], caplog: pytest.LogCaptureFixture) -> None:
    server, keyfile = keyed
    caplog.set_level(logging.DEBUG)
    for key, words in ((None, "missing API key"), ("wrong-key", "invalid API key")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ask(server.grpc_port, key)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        assert words in (e.value.details() or "")
        assert "wrong-key" not in (e.value.details() or "")
    assert await ask(server.grpc_port, INLINE) and await ask(server.grpc_port, FROM_FILE)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    # rotation: the new key works at once, the removed one no longer does
    keyfile.write_text(f"{ROTATED}\n")
    os.utime(keyfile, ns=(1, 10**18))
    assert await ask(server.grpc_port, ROTATED)
    with pytest.raises(grpc.aio.AioRpcError):
        await ask(server.grpc_port, FROM_FILE)
    logged = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert not any(k in logged for k in (INLINE, FROM_FILE, ROTATED, "wrong-key"))


async def test_the_cli_client_sends_its_key(keyed: tuple[ThinkerServer, Path]) -> None:
    server, _ = keyed
    cli = [sys.executable, "-m", "voice_llm.client", "--addr",
           f"127.0.0.1:{server.grpc_port}", "--text", "Hi", "--max-tokens", "3"]

    def run(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # the server runs in this process's event loop: the client must not block it
        return subprocess.run([*cli, *extra], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})



    refused = await asyncio.to_thread(run)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
    ok = await asyncio.to_thread(run, "--api-key", INLINE)
    assert ok.returncode == 0 and "finish=" in ok.stderr, ok.stderr
    ok = await asyncio.to_thread(run, env={"LLM_API_KEY": FROM_FILE})
    assert ok.returncode == 0, ok.stderr
