"""Real TTS servers for the service tests: `python -m voice_tts.server` subprocesses on
free localhost ports, with the tiny random-weight preset (audio is noise; behaviour is
what these tests check)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from voice.tts.v1 import tts_pb2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, tmp: Path, argv: list[str] | None = None, **env: str) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.addr = f"127.0.0.1:{self.grpc_port}"
        self.log_path = tmp / f"tts-{self.grpc_port}.log"
        full_env = {
            **os.environ,
            "TTS_MODEL": "preset:tiny",
            "TTS_GRPC_HOST": "127.0.0.1",
            "TTS_GRPC_PORT": str(self.grpc_port),
            "TTS_HTTP_PORT": str(self.http_port),
            # The tiny model on a shared CPU is real time for a few streams only: the
            # protocol tests admit by the open-stream cap; test_admission.py sets it.
            "TTS_ADMIT_MARGIN": "0",
            **env,
        }
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, *(argv or ["-m", "voice_tts.server"])],
                                     env=full_env, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_serving()

    def wait_serving(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.addr) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise TimeoutError(f"server not SERVING in {timeout} s: {self.log_path.read_text()}")

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics") as r:
            return r.read().decode()

    def metric(self, selector: str) -> float:
        """The sum of the samples `selector` names: `name` or `name{label="value",...}`
        (labels not named are summed over, e.g. `protocol`). Absent: 0.0 if the metric is
        declared (a counter with no children yet), else KeyError."""
        name, _, rest = selector.partition("{")
        want = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
        want = {k.strip(): v.strip().strip('"') for k, v in want.items()}
        total, found = 0.0, False
        for family in text_string_to_metric_families(self.metrics()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                    total += s.value
                    found = True
            found = found or family.name == name or family.name + "_total" == name
        if not found:
            raise KeyError(selector)
        return total

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("tts"), TTS_MAX_SESSIONS="64")
    yield s
    s.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:
    made: list[ServerProc] = []

    def make(argv: list[str] | None = None, **env: str) -> ServerProc:
        s = ServerProc(tmp_path, argv, **env)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def config(**kw: object) -> tts_pb2.SessionConfig:
    """A deterministic session: greedy, seeded, short."""
    cfg = tts_pb2.SessionConfig(voice=str(kw.pop("voice", "vivian")), **kw)  # type: ignore[arg-type]
    if not cfg.HasField("seed"):
        cfg.seed = 1234
    cfg.sampling.greedy = True
    if not cfg.sampling.max_frames:
        cfg.sampling.max_frames = 12
    return cfg
