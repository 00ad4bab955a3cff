"""Every metric a dashboard or an alert queries is exported by the running service owning it.

Starts the real services on localhost, each from its own virtualenv with tiny models and
free ports (launch.py: `python -m voice_tts.server` etc. from `.venv/<name>`), scrapes
their /metrics and checks, per service, that every name the dashboards query is there
(a labelled metric with no sample yet counts by its `# TYPE` line).

A service is skipped only when its virtualenv or its `python -m` entry point does not
exist yet; one that exists and fails to start fails the test, with its log.
Boundaries we cannot reach here, named: no LiveKit server binary (the agent gets a
LIVEKIT_URL on a closed local port), no GPU (so dcgm-exporter's DCGM_* names are only
checked statically, in test_observability.py).
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import launch
import pytest
from deploy_support import exported_metrics, owner, queried_metrics

# Tiny models on 2 cores: building the random LLM and warming up the TTS take a while.
START_DEADLINE_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    proc: subprocess.Popen | None
    log: Path | None
    http_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    skip_reason: str | None = None
    metrics_status: int = 0
    metrics: str = ""
    healthz_status: int = 0
    exit_code: int | None = None

    def __repr__(self) -> str:  # keep pytest's failure output short
        state = self.skip_reason or f"exit={self.proc.poll() if self.proc else None}"
        return f"Running(port={self.http_port}, {state})"

    def log_tail(self, n: int = 40) -> str:
        if not self.log or not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> dict[str, Running]:
    """Starts every service that exists, all at once; scrapes each; stops them all."""
    logs = tmp_path_factory.mktemp("mesh")
    ports = {name: free_port() for name in launch.DEFAULT_PORTS}
    closed_livekit = f"ws://127.0.0.1:{free_port()}"  # fake boundary: nothing listens
    envs = launch.environments(ports, closed_livekit)
    running: dict[str, Running] = {}
    for svc in launch.SERVICES:
        reason = launch.missing_reason(svc)
        if reason:
            running[svc.name] = Running(None, None, skip_reason=reason)
            continue
        log = logs / f"{svc.name}.log"
        env = envs[svc.name]
        if svc.name == "llm":
            env = env | {"LLM_CACHE_DIR": str(logs / "llm-cache")}  # tiny-random built here
        proc = launch.start(svc, env, log)
        running[svc.name] = Running(proc, log, ports[svc.http_var], ports)
    end = time.monotonic() + START_DEADLINE_S
    try:
        for name, r in running.items():
            if r.proc is None:
                continue
            base = f"http://127.0.0.1:{r.http_port}"
            left = max(1.0, end - time.monotonic())
            r.metrics_status, r.metrics = launch.wait_http(f"{base}/metrics", r.proc, left)
            if name == "agent":  # ready = registered with LiveKit, absent here
                r.healthz_status, _ = launch.http_get(f"{base}/healthz")
            else:  # ready after warm-up: wait for it
                left = max(1.0, end - time.monotonic())
                r.healthz_status, _ = launch.wait_http(f"{base}/healthz", r.proc, left)
        yield running
    finally:
        for r in running.values():
            if r.proc is not None:
                r.exit_code = launch.stop(r.proc)


def wanted_by(service: str) -> set[str]:
    return {m for m in queried_metrics() if owner(m) == service}


@pytest.mark.parametrize("service", [s.name for s in launch.SERVICES])
def test_dashboard_metrics_are_exported_by_the_running_service(mesh, service):
    r = mesh[service]
    if r.skip_reason:
        pytest.skip(r.skip_reason)
    wanted = wanted_by(service)
    assert wanted, f"the dashboards query nothing from {service}"
    assert r.metrics_status == 200, (
        f"{service}: GET /metrics answered {r.metrics_status or 'nothing'} "
        f"(exit code {r.proc.poll()})\n--- log ---\n{r.log_tail()}"
    )
    missing = sorted(wanted - exported_metrics(r.metrics))
    assert not missing, (
        f"{service} does not export {missing}, which dashboards/alerts query.\n"
        f"It exports: {sorted(n for n in exported_metrics(r.metrics) if '_' in n)}"
    )


@pytest.mark.parametrize("service", [s.name for s in launch.SERVICES])
def test_healthz_answers_for_the_container_healthcheck(mesh, service):
    """compose and the Dockerfiles probe /healthz (deploy/docker/healthcheck.py)."""
    r = mesh[service]
    if r.skip_reason:
        pytest.skip(r.skip_reason)
    if service == "agent":
        # Ready means registered with LiveKit, which is not here: it must answer, though.
        assert r.healthz_status in (200, 503), f"agent /healthz: {r.healthz_status}"
    else:
        assert r.healthz_status == 200, (
            f"{service}: /healthz answered {r.healthz_status or 'nothing'} within "
            f"{START_DEADLINE_S:.0f} s (exit code {r.proc.poll()})\n--- log ---\n{r.log_tail()}"
        )


@pytest.mark.parametrize("service", ["tts", "llm"])
def test_grpc_health_says_serving_for_probes_and_envoy(mesh, service):
    """Kubernetes grpc probes and Envoy's health check (deploy/k8s) ask grpc.health.v1
    about the server as a whole (service ""): it must answer SERVING once warm."""
    import grpc  # in the tools venv; the health messages are hand-encoded below

    r = mesh[service]
    if r.skip_reason:
        pytest.skip(r.skip_reason)
    port = r.ports[launch.BY_NAME[service].grpc_var]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b, response_deserializer=lambda b: b,
        )
        # HealthCheckRequest{service: ""} is the empty message; the reply's field 1
        # (status) is SERVING = 1, encoded as 08 01.
        reply = check(b"", timeout=10)
    assert reply == b"\x08\x01", f"{service}: health reply {reply!r}, expected SERVING"


def test_exposition_parser_counts_declared_but_empty_metrics():
    text = (
        "# HELP tts_errors_total Calls ended with an error\n"
        "# TYPE tts_errors_total counter\n"
        "# TYPE llm_aborts counter\n"
        "llm_aborts_total 0.0\n"
        "# TYPE tts_rtf histogram\n"
        'tts_rtf_bucket{le="0.1"} 0.0\n'
        "tts_rtf_count 0.0\n"
    )
    names = exported_metrics(text)
    assert {"tts_errors_total", "llm_aborts_total", "tts_rtf"} <= names
    assert "tts_ttfa_seconds" not in names
