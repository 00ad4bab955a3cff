"""Helpers the services' test suites share: a free localhost port, waiting for a spawned
gRPC server to report SERVING, stopping it as an orchestrator would (SIGTERM, then
SIGKILL), and reading one value off a Prometheus `/metrics` text.

A test-only package: each service declares `voice-testkit` in its `[test]` extra and the
Makefile installs it from the checkout (libs/voice-testkit); no image ships it.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["free_port", "free_ports", "metric_value", "stop_process", "wait_grpc_serving"]


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
