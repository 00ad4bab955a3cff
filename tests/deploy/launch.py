"""Starts the real services from their virtualenvs on localhost, tiny models, free ports.

For the live deploy tests (test_metrics_live.py): each service is run exactly as the
team conventions name it (`python -m voice_tts.server`, `python -m voice_llm.server`,
`python -m voice_agent`, `python -m voice_token`) from `.venv/<name>`, wired to the
others by port. `make up`'s own local mesh is deploy/local/mesh.py (a supervisor);
this is only what the tests need: start, poll, stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# LiveKit's --dev keys; the token service and the agent must sign with the same pair.
DEV_KEY, DEV_SECRET = "devkey", "secret-for-the-deploy-tests-0123456789"


@dataclass(frozen=True)
class Service:
    name: str  # also the virtualenv: .venv/<name>
    module: str  # python -m <module>
    http_var: str  # env var of its /metrics + /healthz port
    grpc_var: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # tiny models, CPU


SERVICES: tuple[Service, ...] = (
    Service("tts", "voice_tts.server", "TTS_HTTP_PORT", "TTS_GRPC_PORT",
            {"TTS_MODEL": "preset:tiny", "TTS_DEVICE": "cpu"}),
    Service("llm", "voice_llm.server", "LLM_HTTP_PORT", "LLM_GRPC_PORT",
            {"LLM_BACKEND": "transformers", "LLM_MODEL": "tiny-random"}),
    Service("agent", "voice_agent", "AGENT_HTTP_PORT"),
    Service("token", "voice_token", "TOKEN_HTTP_PORT"),
)
BY_NAME = {s.name: s for s in SERVICES}
# The ports of the team conventions (and of compose.yaml).
DEFAULT_PORTS = {
    "TTS_GRPC_PORT": 50051, "TTS_HTTP_PORT": 8001,
    "LLM_GRPC_PORT": 50052, "LLM_HTTP_PORT": 8002,
    "AGENT_HTTP_PORT": 8003, "TOKEN_HTTP_PORT": 8080,
}


def python_of(svc: Service, root: Path = ROOT) -> Path:
    return root / ".venv" / svc.name / "bin" / "python"


def missing_reason(svc: Service, root: Path = ROOT) -> str | None:
    """Why this service cannot be started from its venv yet, or None when it can."""
    py = python_of(svc, root)
    if not py.exists():
        return f"{svc.name}: no virtualenv at {py.parent.parent} (make venvs builds it)"
    # `python -m pkg` needs pkg/__main__.py; `python -m mod` only the module itself.
    probe = (
        "import importlib.util as u, sys; "
        f"s = u.find_spec({svc.module!r}); "
        "ok = s and (not s.submodule_search_locations"
        f" or u.find_spec({svc.module + '.__main__'!r})); "
        "sys.exit(0 if ok else 3)"
    )
    rc = subprocess.run([str(py), "-c", probe], capture_output=True, timeout=60).returncode
    if rc != 0:
        return f"{svc.name}: `python -m {svc.module}` has no entry point in {py} yet"
    return None


def environments(
    ports: dict[str, int], livekit_url: str, key: str = DEV_KEY, secret: str = DEV_SECRET
) -> dict[str, dict[str, str]]:
    """The env of each service: tiny models on the CPU, wired to each other by port."""
    livekit = {"LIVEKIT_URL": livekit_url, "LIVEKIT_API_KEY": key, "LIVEKIT_API_SECRET": secret}
    envs: dict[str, dict[str, str]] = {}
    for svc in SERVICES:
        env = dict(svc.env)
        env[svc.http_var] = str(ports[svc.http_var])
        if svc.grpc_var:
            env[svc.grpc_var] = str(ports[svc.grpc_var])
        envs[svc.name] = env
    envs["agent"] |= livekit | {
        "AGENT_TTS_ADDR": f"127.0.0.1:{ports['TTS_GRPC_PORT']}",
        "AGENT_THINKER_ADDR": f"127.0.0.1:{ports['LLM_GRPC_PORT']}",
    }
    envs["token"] |= livekit
    return envs


def start(svc: Service, env: dict[str, str], log_path: Path, root: Path = ROOT) -> subprocess.Popen:
    """Starts one service in its own process group, stdout+stderr to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(python_of(svc, root)), "-m", svc.module],
            cwd=root, env=full_env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_http(url: str, proc: subprocess.Popen | None, deadline_s: float) -> tuple[int, str]:
    """Polls url until it answers 200 or the process exits or the deadline passes."""
    end = time.monotonic() + deadline_s
    status, body = 0, ""
    while time.monotonic() < end:
        status, body = http_get(url)
        if status == 200:
            break
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.5)
    return status, body


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int | None:
    """SIGTERM (graceful shutdown), then SIGKILL after grace_s; returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode
