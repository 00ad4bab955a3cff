"""The process around the servicer: health, reflection, /metrics, --help, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from conftest import Thinker, request, user
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc
from voice_testkit import free_port, wait_grpc_serving


async def test_health_is_serving_after_warmup(thinker: Thinker) -> None:
    stub = health_pb2_grpc.HealthStub(thinker.channel)
    for service in ("", "voice.llm.v1.Thinker"):
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_thinker(thinker: Thinker) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(thinker.channel)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    async for resp in stub.ServerReflectionInfo(iter([req])):
        names = {s.name for s in resp.list_services_response.service}
        assert {"voice.llm.v1.Thinker", "grpc.health.v1.Health"} <= names
        break


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_http_metrics_and_healthz(thinker: Thinker) -> None:
    await thinker.chat(request(user("hi"), max_tokens=2))
    port = thinker.server.http_port
    status, body = await asyncio.to_thread(http_get, port, "/metrics")
    assert status == 200
    for name in (
        "llm_ttft_seconds_bucket",
        "llm_generated_tokens_total",
        "llm_tokens_per_second_count",
        "llm_active_requests",
        "llm_aborts_total",
    ):
        assert name in body
    status, body = await asyncio.to_thread(http_get, port, "/healthz")
    assert (status, json.loads(body)) == (200, {"status": "SERVING"})
    assert (await asyncio.to_thread(http_get, port, "/nope"))[0] == 404


def test_help_lists_the_env_vars() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "voice_llm.server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for var in (
        "LLM_BACKEND",
        "LLM_MODEL",
        "LLM_GRPC_PORT",
        "LLM_MAX_CONCURRENT",
        "LLM_GPU_MEMORY_UTILIZATION",
        "LLM_KV_CACHE_DTYPE",
        "LLM_QUANTIZATION",
    ):
        assert var in out


def test_bad_env_fails_fast_with_the_name() -> None:
    env = {**os.environ, "LLM_MAX_CONCURRENT": "zero", "LLM_BACKEND": "tensorrt"}
    proc = subprocess.run(
        [sys.executable, "-m", "voice_llm.server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "LLM_MAX_CONCURRENT" in proc.stderr and "LLM_BACKEND" in proc.stderr


async def wait_serving(addr: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    await asyncio.to_thread(wait_grpc_serving, addr, proc, timeout)


async def test_sigterm_drains_then_exits(cache_dir: Path) -> None:
    """`python -m voice_llm.server` as a process: an in-flight call finishes, a new one is
    refused with UNAVAILABLE, and the process exits 0."""
    port = free_port()
    env = {
        **os.environ,
        "LLM_BACKEND": "transformers",
        "LLM_MODEL": "tiny-random",
        "LLM_CACHE_DIR": str(cache_dir),
        "LLM_GRPC_HOST": "127.0.0.1",
        "LLM_GRPC_PORT": str(port),
        "LLM_HTTP_PORT": "0",
        "LLM_DRAIN_SECONDS": "20",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "voice_llm.server"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        addr = f"127.0.0.1:{port}"
        await wait_serving(addr, proc)
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = pb_grpc.ThinkerStub(ch)
            # ~800 steps (2 s or more here): still running when SIGTERM lands.
            call = stub.Chat(request(user("Keep going."), max_tokens=800, temperature=0.0))
            await call.read()
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Chat(request(user("Late."), max_tokens=3)).read()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            deltas = []
            while (d := await call.read()) is not grpc.aio.EOF:
                deltas.append(d)
            assert deltas[-1].final.completion_tokens == 800, "the in-flight call completed"
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_a_call_before_the_model_has_loaded_gets_unavailable(cache_dir: Path) -> None:
    """The port is bound before the model loads (probes see NOT_SERVING): a Chat then is
    told to retry (UNAVAILABLE), not failed as an internal error."""
    from conftest import make_settings
    from voice_llm.server import ThinkerServer

    server = ThinkerServer(make_settings(cache_dir))
    loaded = asyncio.Event()
    real_start = server.backend.start

    async def slow_start() -> None:
        await loaded.wait()
        await real_start()

    server.backend.start = slow_start  # type: ignore[method-assign]
    starting = asyncio.create_task(server.start())
    while not getattr(server, "grpc_port", 0) or getattr(server, "_http", None) is None:
        await asyncio.sleep(0.02)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            stub = pb_grpc.ThinkerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Chat(request(user("Too early."), max_tokens=3)).read()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "still loading" in (err.value.details() or "")
            loaded.set()
            await starting
            deltas = [d async for d in stub.Chat(request(user("Now."), max_tokens=3))]
            assert deltas[-1].final.completion_tokens > 0
    finally:
        loaded.set()
        await starting
        await server.stop()


async def test_a_device_fault_ends_the_process_fast_not_a_serving_zombie(
        cache_dir: Path) -> None:
    """After a CUDA fault the context is poisoned: the call gets UNAVAILABLE (retry
    elsewhere), health turns NOT_SERVING and the process exits 3 within seconds for the
    orchestrator to restart, instead of saying SERVING and failing every call."""
    port = free_port()
    env = {**os.environ, "LLM_BACKEND": "transformers", "LLM_MODEL": "tiny-random",
           "LLM_CACHE_DIR": str(cache_dir), "LLM_GRPC_HOST": "127.0.0.1",
           "LLM_GRPC_PORT": str(port), "LLM_HTTP_PORT": "0", "LLM_TEST_FAULT_AT": "8"}
    script = str(Path(__file__).with_name("faulty_thinker.py"))
    proc = subprocess.Popen([sys.executable, script], env=env, stderr=subprocess.PIPE,
                            text=True)
    try:
        addr = f"127.0.0.1:{port}"
        await wait_serving(addr, proc)
        async with grpc.aio.insecure_channel(addr) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in pb_grpc.ThinkerStub(ch).Chat(
                        request(user("Go."), max_tokens=20, temperature=0.0)):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "restarting" in (err.value.details() or "")
        faulted = time.monotonic()
        assert await asyncio.to_thread(proc.wait, 10) == 3
        assert time.monotonic() - faulted < 5
        assert "device fault" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
