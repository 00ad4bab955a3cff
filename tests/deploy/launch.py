"""The local mesh: every service from its own virtualenv on localhost, tiny models, no Docker.

`make up` falls back to this when no Docker engine is reachable (deploy/up.sh), and
tests/deploy starts the very same processes to scrape their /metrics: one definition of
how each service is launched outside a container (entry point, env for tiny models,
ports), next to compose.yaml which is the definition inside one.

  python deploy/localmesh.py up      # start tts, llm, agent, token; wait for /healthz
  python deploy/localmesh.py status  # which are up
  python deploy/localmesh.py down    # SIGTERM them (pids in .run/mesh/)

The agent connects to LIVEKIT_URL (default ws://127.0.0.1:7880): a `livekit-server`
binary on PATH is started in --dev mode with the mesh, otherwise the agent waits for one.
Standard library only, so it runs under any Python 3.11.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = ROOT / ".run" / "mesh"
# LiveKit's --dev keys; the token service and the agent must sign with the same pair.
DEV_KEY, DEV_SECRET = "devkey", "secret"


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


# --- CLI: up / status / down ---------------------------------------------------------------


def _pidfile(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(name: str) -> int | None:
    try:
        pid = int(_pidfile(name).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def cmd_up(args: argparse.Namespace) -> int:
    livekit_url = os.environ.get("LIVEKIT_URL", "ws://127.0.0.1:7880")
    key = os.environ.get("LIVEKIT_API_KEY", DEV_KEY)
    secret = os.environ.get("LIVEKIT_API_SECRET", DEV_SECRET)
    envs = environments(DEFAULT_PORTS, livekit_url, key, secret)
    if shutil.which("livekit-server") and _read_pid("livekit") is None:
        log = RUN_DIR / "livekit.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as f:
            lk = subprocess.Popen(["livekit-server", "--dev"], stdout=f, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        _pidfile("livekit").write_text(str(lk.pid))
        print(f"livekit-server --dev (pid {lk.pid}), log {log}")
    elif _read_pid("livekit") is None:
        print(f"no livekit-server on PATH: the agent will wait for LiveKit at {livekit_url}")
    failed = []
    started: dict[str, subprocess.Popen] = {}
    for svc in SERVICES:
        if _read_pid(svc.name):
            print(f"{svc.name}: already running")
            continue
        reason = missing_reason(svc)
        if reason:
            print(f"skip {reason}")
            failed.append(svc.name)
            continue
        proc = start(svc, envs[svc.name], RUN_DIR / f"{svc.name}.log")
        _pidfile(svc.name).write_text(str(proc.pid))
        started[svc.name] = proc
    for name, proc in started.items():
        svc = BY_NAME[name]
        url = f"http://127.0.0.1:{DEFAULT_PORTS[svc.http_var]}/healthz"
        status, _ = wait_http(url, proc, args.timeout)
        state = "up" if status == 200 else f"NOT ready (HTTP {status or 'no answer'})"
        print(f"{name}: {state}  {url}  log {RUN_DIR / (name + '.log')}")
        if status != 200:
            failed.append(name)
    print(f"web page: http://127.0.0.1:{DEFAULT_PORTS['TOKEN_HTTP_PORT']}/   stop: make down")
    return 1 if failed else 0


def cmd_status(_: argparse.Namespace) -> int:
    for svc in SERVICES:
        pid = _read_pid(svc.name)
        status, _ = http_get(f"http://127.0.0.1:{DEFAULT_PORTS[svc.http_var]}/healthz")
        print(f"{svc.name:6} pid={pid or '-':<8} healthz={status or 'no answer'}")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    for name in [*(s.name for s in SERVICES), "livekit"]:
        pid = _read_pid(name)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            print(f"{name}: SIGTERM sent (pid {pid})")
        _pidfile(name).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start every service from its venv, tiny models")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait per service")
    sub.add_parser("status", help="which services answer /healthz")
    sub.add_parser("down", help="stop what `up` started")
    args = parser.parse_args(argv)
    return {"up": cmd_up, "status": cmd_status, "down": cmd_down}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
