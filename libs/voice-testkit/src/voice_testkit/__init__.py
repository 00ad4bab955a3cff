"""Helpers the services' test suites share: a free localhost port, waiting for a spawned
gRPC server to report SERVING, stopping it as an orchestrator would (SIGTERM, then
SIGKILL), reading one value off a Prometheus `/metrics` text, and the local mesh started
on free ports for a test or a bench (`start_mesh`, `stop_mesh`).

A test-only package: each service declares `voice-testkit` in its `[test]` extra and the
Makefile installs it from the checkout (libs/voice-testkit); no image ships it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MESH_PORT_VARS", "MeshDidNotStart", "free_port", "free_ports", "metric_value",
           "start_mesh", "stop_mesh", "stop_process", "wait_grpc_serving"]


def free_port() -> int:
    """A localhost TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """n distinct free localhost ports (all held open while the OS picks, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_grpc_serving(addr: str, proc: subprocess.Popen | None = None,
                      timeout: float = 120.0, log: Path | None = None) -> None:
    """Poll the gRPC health service at `addr` until it says SERVING.

    RuntimeError at once if `proc` exits first, TimeoutError after `timeout` seconds;
    both carry the tail of `log` (the server's output) when given.
    """
    # Imported here: the package also serves the token service's venv, which has no gRPC.
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:] if log is not None else ""

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(addr) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {tail()}")
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{addr} not SERVING in {timeout} s: {tail()}")


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM (the graceful drain under test), SIGKILL if it is still running after
    `timeout` seconds; the exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def metric_value(text: str, selector: str) -> float:
    """The sum of the samples `selector` names in Prometheus text: `name` or
    `name{label="value",...}`; labels not named are summed over (e.g. `protocol`).

    Absent: 0.0 if the metric is declared (a counter with no children yet), else KeyError.
    """
    name, _, rest = selector.partition("{")
    pairs = (kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
    want = {k.strip(): v.strip().strip('"') for k, v in pairs}
    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                total += s.value
                found = True
        found = found or family.name == name or family.name + "_total" == name
    if not found:
        raise KeyError(selector)
    return total


# The local mesh's ports (deploy/local/mesh.py), each set from its env var.
MESH_PORT_VARS = ("TTS_GRPC_PORT", "TTS_HTTP_PORT", "LLM_GRPC_PORT", "LLM_HTTP_PORT",
                  "TOKEN_HTTP_PORT", "AGENT_HTTP_PORT")


class MeshDidNotStart(RuntimeError):
    """`deploy/local/mesh.py up` ended or timed out before "mesh: up"; `lines` is its output."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("the mesh did not start:\n" + "".join(lines[-30:]))
        self.lines = lines


def start_mesh(root: Path, run_dir: Path, env: dict[str, str] | None = None,
               timeout_s: float = 400.0, on_line: Callable[[str], object] | None = None,
               ) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`deploy/local/mesh.py up` from `root` on free ports (MESH_PORT_VARS), its state in
    `run_dir`, `env` over this process's (without LIVEKIT_URL / TOKEN_AGENT_WS_URL: the
    page talks to the agent's WebSocket), in its own process group, until it says
    "mesh: up" (each line to `on_line`). Returns the process and the env it runs with;
    stop it with `stop_mesh`. MeshDidNotStart if it does not come up."""
    full = {k: v for k, v in os.environ.items() if k not in ("LIVEKIT_URL", "TOKEN_AGENT_WS_URL")}
    full.update(zip(MESH_PORT_VARS, map(str, free_ports(len(MESH_PORT_VARS))), strict=True))
    full.update({"MESH_RUN_DIR": str(run_dir), **(env or {})})
    proc = subprocess.Popen(["python3", "deploy/local/mesh.py", "up"], cwd=root, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        lines.append(line)
        if on_line is not None:
            on_line(line)
        if "mesh: up" in line:
            return proc, full
    stop_mesh(proc)
    raise MeshDidNotStart(lines)


def stop_mesh(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """SIGTERM to the mesh's process group (it stops its services), SIGKILL if it hangs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
