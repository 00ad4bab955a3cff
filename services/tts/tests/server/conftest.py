"""Real TTS servers for the service tests: `python -m voice_tts.server` subprocesses on
free localhost ports, with the tiny random-weight preset (audio is noise; behaviour is
what these tests check)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from voice.tts.v1 import tts_pb2
from voice_testkit import free_port, metric_value, stop_process, wait_grpc_serving


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
            # one process on any host (auto gives 8+ CPU hosts 2 fronts): the fronts have
            # their own tests (test_front_procs.py)
            "TTS_FRONT_PROCS": "0",
            **env,
        }
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, *(argv or ["-m", "voice_tts.server"])],
                                     env=full_env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_grpc_serving(self.addr, self.proc, timeout=120.0, log=self.log_path)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics") as r:
            return r.read().decode()

    def metric(self, selector: str) -> float:
        """`voice_testkit.metric_value` of this server's /metrics: `name` or
        `name{label="value",...}`, summed over the labels not named."""
        return metric_value(self.metrics(), selector)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> int:
        code = stop_process(self.proc, timeout=30)
        self.log.close()
        return code


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
