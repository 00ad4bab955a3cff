"""voice_testkit against real inputs: a registry's own exposition text, a real gRPC
health server, a real child process that exits."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from voice_testkit import free_port, free_ports, metric_value, stop_process, wait_grpc_serving


@pytest.fixture
def text() -> str:
    r = CollectorRegistry()
    c = Counter("calls", "calls", ["protocol", "reason"], registry=r)
    c.labels("grpc", "ok").inc(2)
    c.labels("websocket", "ok").inc(3)
    c.labels("websocket", "cancelled").inc(5)
    Counter("errors", "no children yet", ["code"], registry=r)
    Gauge("active", "active", registry=r).set(4)
    return generate_latest(r).decode()


def test_metric_value_sums_over_the_labels_not_named(text: str) -> None:
    assert metric_value(text, "calls_total") == 10
    assert metric_value(text, 'calls_total{reason="ok"}') == 5
    assert metric_value(text, 'calls_total{protocol="websocket", reason="cancelled"}') == 5
    assert metric_value(text, 'calls_total{protocol="http"}') == 0
    assert metric_value(text, "active") == 4


def test_metric_value_declared_is_zero_undeclared_raises(text: str) -> None:
    assert metric_value(text, "errors_total") == 0.0
    with pytest.raises(KeyError):
        metric_value(text, "nope_total")


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_can_all_be_bound_at_once() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    socks = [socket.socket() for _ in ports]
    try:
        for s, port in zip(socks, ports, strict=True):
            s.bind(("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def test_wait_grpc_serving_returns_once_serving(health_server) -> None:  # type: ignore[no-untyped-def]
    addr, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    wait_grpc_serving(addr, timeout=5)


def test_wait_grpc_serving_times_out_with_the_log(health_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    addr, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    log = tmp_path / "server.log"
    log.write_text("still warming up")
    with pytest.raises(TimeoutError, match="still warming up"):
        wait_grpc_serving(addr, timeout=0.5, log=log)


def test_wait_grpc_serving_fails_fast_when_the_process_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(10)
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_grpc_serving(f"127.0.0.1:{free_port()}", proc=proc, timeout=30)


def child(code: str) -> subprocess.Popen:
    """A python child that has set up its signal handling before this returns."""
    proc = subprocess.Popen([sys.executable, "-c", f"{code}\nprint('up', flush=True)\n"
                             "import time\nwhile True: time.sleep(0.05)"],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_stop_process_drains_on_sigterm() -> None:
    proc = child("import signal, sys\n"
                 "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))")
    assert stop_process(proc, timeout=10) == 7


def test_stop_process_kills_what_ignores_sigterm() -> None:
    proc = child("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)")
    assert stop_process(proc, timeout=0.3) == -signal.SIGKILL
