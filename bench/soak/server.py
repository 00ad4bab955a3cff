"""The server under test: start, stop, health, /metrics, its log's faults, nvidia-smi."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Lines of the server log that mean the engine (or the GPU) failed.
FAULT_PATTERNS = (
    "failed; ending their utterances",
    "engine step failed",
    "engine iteration failed",
    "fatal engine fault",
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "Synthesize failed",
    "on_step hook failed",
    "Traceback",
    " CRITICAL ",
)
# Any other line the server logged at ERROR (format "time LEVEL logger message").
ERROR_LEVEL = re.compile(r"^\S+ \S+ ERROR ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels as written by the server), and
    {'name': the sum over its label sets} for a labeled metric (e.g. over `protocol`)."""
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(val)
            if "{" in key:
                name = key.split("{", 1)[0]
                sums[name] = sums.get(name, 0.0) + float(val)
    return {**sums, **out}


def server_info(metrics: dict[str, float]) -> dict[str, str] | None:
    """The server's `tts_server_info` labels (model, device, front_procs, log_level, ...)
    from parsed /metrics; None for a server that does not export it."""
    for key in metrics:
        if key.startswith("tts_server_info{"):
            return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', key))
    return None


def nvidia_smi_mb() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, check=True)
        return float(r.stdout.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


class Server:
    """The server under test: started here (`--start-server`) or already running."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = Path(a.server_log) if a.server_log else None
        self.exit_code: int | None = None
        if a.start_server:
            port = a.grpc_port or free_port()
            self.http_port = a.http_port or free_port()
            self.addr = f"127.0.0.1:{port}"
        else:
            self.addr = a.addr
            self.http_port = a.http_port
        host = self.addr.rsplit(":", 1)[0]
        self.metrics_url = (f"http://{host}:{self.http_port}/metrics"
                            if self.http_port else None)

    def start(self) -> None:
        a = self.a
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="soak-")) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TTS_MODEL": a.model, "TTS_DEVICE": a.device,
               "TTS_MAX_SESSIONS": str(a.max_sessions), "TTS_GRPC_HOST": "127.0.0.1",
               "TTS_GRPC_PORT": self.addr.rsplit(":", 1)[1],
               "TTS_HTTP_PORT": str(self.http_port)}
        for kv in a.server_env:
            k, _, v = kv.partition("=")
            env[k] = v
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "voice_tts.server"], env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    async def health(self, timeout: float = 5.0) -> str:
        async with grpc.aio.insecure_channel(self.addr) as ch:
            try:
                r = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=timeout)
                return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.aio.AioRpcError as e:
                return f"error: {e.code().name}"

    async def wait_serving(self, timeout: float, interrupted: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if interrupted is not None and interrupted():
                raise RuntimeError("interrupted while waiting for the server")
            if not self.alive():
                raise RuntimeError(f"server exited ({self.proc.returncode}): "  # type: ignore[union-attr]
                                   f"{self.log_tail()}")
            if await self.health(timeout=1.0) == "SERVING":
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"server not SERVING in {timeout:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def metrics(self) -> dict[str, float] | None:
        if not self.metrics_url:
            return None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                return parse_metrics(r.read().decode())
        except OSError:
            return None

    def rss_mb(self) -> float | None:
        if self.proc is None:
            return None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return None

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.exit_code = -9
                return
        self.exit_code = self.proc.returncode

    def faults(self) -> dict[str, Any]:
        """Fault lines of the server log (count per pattern, the first few lines) and the
        other ERROR lines."""
        out: dict[str, Any] = {"log": None, "counts": {}, "lines": [], "errors": 0,
                               "error_lines": []}
        if not self.log_path or not self.log_path.exists():
            return out
        out["log"] = str(self.log_path)
        with open(self.log_path, errors="replace") as f:
            for line in f:
                hit = next((p for p in FAULT_PATTERNS if p in line), None)
                if hit is not None:
                    out["counts"][hit.strip()] = out["counts"].get(hit.strip(), 0) + 1
                    if len(out["lines"]) < 10:
                        out["lines"].append(line.rstrip()[:300])
                elif ERROR_LEVEL.match(line):
                    out["errors"] += 1
                    if len(out["error_lines"]) < 10:
                        out["error_lines"].append(line.rstrip()[:300])
        return out


