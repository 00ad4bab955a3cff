"""Start the agent's backends for a direct run: the real TTS and thinker servers.

`--spawn-backends` runs `python -m voice_tts.server` (TTS_MODEL=preset:tiny) and
`python -m voice_llm.server` (LLM_BACKEND=transformers, LLM_MODEL=tiny-random) as
child processes on free localhost ports, each from its own virtualenv (they need
torch; this package must not), waits for their /healthz, and stops them with SIGTERM
at the end. Their logs go to the run directory (backends/*.log).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_ATTEMPTS = 3  # a free port may be taken by another process before a backend binds it


class PortTaken(RuntimeError):
    """A backend did not get its port: it exited, or another server answers there."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Backends:
    tts_addr: str
    thinker_addr: str


def _wait_healthy(name: str, proc: subprocess.Popen[bytes], port: int, log: Path,
                  timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise PortTaken(f"{name} server exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except http.client.HTTPException as e:  # not HTTP/1.1: another process's server
            raise PortTaken(f"{name}: port {port} answers as another server ({e!r:.80})"
                            ) from None
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} server not healthy after {timeout_s:.0f} s (log: {log})")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextmanager
def spawn_backends(log_dir: Path, *, tts_python: str, llm_python: str,
                   timeout_s: float = 300.0, extra_env: dict[str, str] | None = None,
                   ) -> Iterator[Backends]:
    """The backends on fresh free ports (again on new ones, up to START_ATTEMPTS, when
    one did not get its port: on a busy host another process can bind a port between
    its pick and the backend's bind)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        procs: list[subprocess.Popen[bytes]] = []
        try:
            backends = _start(log_dir, procs, tts_python, llm_python, timeout_s,
                              extra_env)
        except BaseException as e:
            _stop(procs)
            if isinstance(e, PortTaken) and attempt < START_ATTEMPTS:
                continue
            raise
        try:
            yield backends
        finally:
            _stop(procs)
        return


def _start(log_dir: Path, procs: list[subprocess.Popen[bytes]], tts_python: str,
           llm_python: str, timeout_s: float, extra_env: dict[str, str] | None) -> Backends:
    ports = {k: free_port() for k in ("tts_grpc", "tts_http", "llm_grpc", "llm_http")}
    base = {**os.environ, **(extra_env or {})}
    # One torch thread per backend: on a small host the TTS, the thinker and the agent
    # share the cores, and OpenMP threads spinning in one starve the agent's real-time
    # playout (seen as underruns: audible dropouts on a busy 2-core host).
    base.setdefault("OMP_NUM_THREADS", "1")
    specs = [
        ("tts", tts_python, "voice_tts.server", ports["tts_http"], {
            "TTS_MODEL": base.get("TTS_MODEL", "preset:tiny"), "TTS_DEVICE": "cpu",
            "TTS_GRPC_PORT": str(ports["tts_grpc"]), "TTS_HTTP_PORT": str(ports["tts_http"]),
        }),
        ("llm", llm_python, "voice_llm.server", ports["llm_http"], {
            "LLM_BACKEND": base.get("LLM_BACKEND", "transformers"),
            "LLM_MODEL": base.get("LLM_MODEL", "tiny-random"),
            "LLM_TORCH_THREADS": base.get("LLM_TORCH_THREADS", "1"),
            "LLM_GRPC_PORT": str(ports["llm_grpc"]), "LLM_HTTP_PORT": str(ports["llm_http"]),
        }),
    ]
    started = []
    for name, py, module, http_port, env in specs:
        if not Path(py).exists():
            raise RuntimeError(f"{name}: python {py} not found (make venvs builds "
                               f".venv/{name}; or set AUTORTC_{name.upper()}_PYTHON)")
        log = log_dir / f"{name}.log"
        with log.open("wb") as fh:
            p = subprocess.Popen([py, "-m", module], env={**base, **env}, stdout=fh,
                                 stderr=subprocess.STDOUT)
        procs.append(p)
        started.append((name, p, http_port, log))
    for name, p, http_port, log in started:
        _wait_healthy(name, p, http_port, log, timeout_s)
    return Backends(tts_addr=f"127.0.0.1:{ports['tts_grpc']}",
                    thinker_addr=f"127.0.0.1:{ports['llm_grpc']}")
