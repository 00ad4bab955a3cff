"""The local mesh: every service as a local process under one supervisor, no Docker.

`make up` runs this when no Docker engine is reachable. It checks the ports, starts the
services from their virtualenvs in dependency order (tts, thinker, token, then the agent),
waits for each health check, prints where everything is, and stops all of them on
Ctrl-C, SIGTERM or `make down` (`mesh.py down`). A service that fails to start stops the
whole mesh with a message naming it and the cause; nothing is left running.

Stdlib only: it runs under any Python 3.11, before or without the services' venvs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = Path(os.environ.get("MESH_RUN_DIR", ROOT / ".run"))
STATE = RUN / "mesh.json"


@dataclass
class Service:
    name: str
    venv: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]  # role -> port, all checked free before start
    health_port: int
    health_timeout_s: float = 180.0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def python(self) -> Path:
        return ROOT / ".venv" / self.venv / "bin" / "python"

    @property
    def log(self) -> Path:
        return RUN / "logs" / f"{self.name}.log"


def _port(var: str, default: int) -> int:
    raw = os.environ.get(var, str(default))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SystemExit(f"mesh: {var}={raw!r} is not a port number (1-65535)")
    return int(raw)


# The tiny CustomVoice, Base and VoiceDesign shapes, random weights (TTS_MODEL takes several)
TINY_TTS = "preset:tiny,preset:tiny-base,preset:tiny-1.7b-design"


def services() -> list[Service]:
    tts_g, tts_h = _port("TTS_GRPC_PORT", 50051), _port("TTS_HTTP_PORT", 8001)
    llm_g, llm_h = _port("LLM_GRPC_PORT", 50052), _port("LLM_HTTP_PORT", 8002)
    tok_h = _port("TOKEN_HTTP_PORT", 8080)
    agent_h = _port("AGENT_HTTP_PORT", 8003)
    weights = os.environ.get("VOICE_TTS_WEIGHTS", "")
    llm_weights = os.environ.get("VOICE_LLM_WEIGHTS", "")
    out = [
        Service("tts", "tts", ["-m", "voice_tts.server"], {
            # one server, one voice namespace: presets (the agent's, `make demo`'s), clones
            # (the README's own voice) and designed voices, each from its own checkpoint
            # (random weights here; VOICE_TTS_WEIGHTS names real ones, comma-separated)
            "TTS_MODEL": weights or TINY_TTS, "TTS_GRPC_HOST": "127.0.0.1",
            # the tiny model on a laptop's CPU steps slower than admission's real-time
            # budget: admit by open streams, so two browser tabs both get (slower) replies
            **({} if weights else {"TTS_ADMIT_MARGIN": os.environ.get("TTS_ADMIT_MARGIN", "0")}),
            "TTS_GRPC_PORT": str(tts_g), "TTS_HTTP_PORT": str(tts_h),
            # the voice library (cloned / designed voices), kept across `make up`s
            "TTS_VOICE_DIR": os.environ.get("TTS_VOICE_DIR", str(RUN / "voices"))},
            {"gRPC": tts_g, "HTTP": tts_h}, tts_h),
        Service("thinker", "llm", ["-m", "voice_llm.server"], {
            "LLM_BACKEND": os.environ.get("LLM_BACKEND", "transformers"),
            "LLM_MODEL": llm_weights or "tiny-random", "LLM_GRPC_HOST": "127.0.0.1",
            # random weights babble to the cap: a short one keeps `make demo-chat` a demo
            **({} if llm_weights else {"LLM_DEFAULT_MAX_TOKENS": "32"}),
            "LLM_GRPC_PORT": str(llm_g), "LLM_HTTP_PORT": str(llm_h)},
            {"gRPC": llm_g, "HTTP": llm_h}, llm_h),
        Service("token", "token", ["-m", "voice_token"], {
            "TOKEN_HTTP_HOST": "127.0.0.1", "TOKEN_HTTP_PORT": str(tok_h),
            # No LiveKit server in the mesh: unless the user names one, the page talks to
            # the agent's own WebSocket (GET /v1/talk on its HTTP port).
            "LIVEKIT_URL": os.environ.get("LIVEKIT_URL", ""),
            "TOKEN_AGENT_WS_URL": os.environ.get("TOKEN_AGENT_WS_URL",
                                                 f"ws://127.0.0.1:{agent_h}/v1/talk"),
            "LIVEKIT_API_KEY": os.environ.get("LIVEKIT_API_KEY", "devkey"),
            "LIVEKIT_API_SECRET": os.environ.get(
                "LIVEKIT_API_SECRET", "secret-for-local-development-only-0123456789")},
            {"HTTP": tok_h}, tok_h),
        Service("agent", "agent", ["-m", "voice_agent", "serve-direct"], {
            "AGENT_TTS_ADDR": f"127.0.0.1:{tts_g}", "AGENT_THINKER_ADDR": f"127.0.0.1:{llm_g}",
            # the agent asks for 150 tokens itself: a random thinker's babble would be a
            # minute of noise on the page
            **({} if llm_weights else {
                "AGENT_LLM_MAX_TOKENS": os.environ.get("AGENT_LLM_MAX_TOKENS", "32")}),
            "AGENT_HTTP_HOST": "127.0.0.1", "AGENT_HTTP_PORT": str(agent_h)},
            {"HTTP": agent_h}, agent_h),
    ]
    only = [s for s in os.environ.get("MESH_SERVICES", "").split(",") if s]
    return [s for s in out if not only or s.name in only]


def port_free(port: int) -> bool:
    """Bindable as a server binds it (SO_REUSEADDR: TIME_WAIT leftovers don't count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _running_supervisor() -> int | None:
    """The pid of a mesh supervisor that is still running (from its state file)."""
    try:
        pid = int(json.loads(STATE.read_text())["supervisor"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()  # gone, or a reused pid: no
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if b"mesh.py" in cmdline else None


class Mesh:
    def __init__(self, svcs: list[Service]) -> None:
        self.svcs = svcs
        self.stopping = False

    def preflight(self) -> None:
        running = _running_supervisor()
        if running is not None:
            # Not an error: the user asked for a running stack and has one. Say where it is.
            ports = json.loads(STATE.read_text())["services"].get("token", {}).get("ports", {})
            page = f"http://127.0.0.1:{next(iter(ports.values()), 8080)}/"
            print(f"mesh: already running (supervisor pid {running}): web page {page}   "
                  "stop: `make down`", flush=True)
            raise SystemExit(0)
        for s in self.svcs:
            if not s.python.exists():
                raise SystemExit(f"mesh: {s.name}: {s.python} is missing; run `make venvs`")
            for role, port in s.ports.items():
                if not port_free(port):
                    var = next((k for k, v in s.env.items()
                                if k.endswith("_PORT") and v == str(port)), "its port variable")
                    raise SystemExit(f"mesh: {s.name}: port {port} ({role}) is taken by another "
                                     f"process; free it, or move the mesh's with {var}=<port> "
                                     f"(e.g. `{var}={port + 100} make up`)")

    def start(self) -> None:
        (RUN / "logs").mkdir(parents=True, exist_ok=True)
        for s in self.svcs:
            env = {**os.environ, **s.env, "PYTHONUNBUFFERED": "1"}
            if s.log.exists():  # the last run's log is kept beside the new one
                s.log.replace(s.log.with_name(s.log.name + ".1"))
            log = open(s.log, "wb")  # noqa: SIM115 (kept open for the child's lifetime)
            # Own process group: stopping the mesh stops every child's children too.
            s.proc = subprocess.Popen([str(s.python), *s.argv], env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            print(f"  starting {s.name:8s} pid {s.proc.pid:<7d} log {_rel(s.log)}",
                  flush=True)
            self._wait_healthy(s)
        self._write_state()

    def _wait_healthy(self, s: Service) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < s.health_timeout_s:
            if self.stopping:
                raise SystemExit(1)
            assert s.proc is not None
            rc = s.proc.poll()
            if rc is not None:
                raise RuntimeError(f"{s.name} exited with code {rc} during start-up; its log "
                                   f"({_rel(s.log)}) ends with:\n{_tail(s.log)}")
            if _healthy(s.health_port):
                print(f"  {s.name:8s} healthy in {time.monotonic() - t0:.1f} s", flush=True)
                return
            time.sleep(0.25)
        raise RuntimeError(f"{s.name} not healthy after {s.health_timeout_s:.0f} s; its log "
                           f"ends with:\n{_tail(s.log)}")

    def _write_state(self) -> None:
        STATE.write_text(json.dumps({
            "supervisor": os.getpid(),
            "services": {s.name: {"pid": s.proc.pid if s.proc else None, "ports": s.ports,
                                  "log": str(s.log)} for s in self.svcs},
        }, indent=2))

    def watch(self) -> int:
        """Runs until a signal or until a service dies (then everything stops)."""
        while not self.stopping:
            for s in self.svcs:
                if s.proc is not None and s.proc.poll() is not None:
                    print(f"mesh: {s.name} exited with code {s.proc.returncode}; stopping "
                          f"the mesh. Its log ends with:\n{_tail(s.log)}", file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0

    def stop(self) -> None:
        for s in reversed(self.svcs):
            if s.proc is not None and s.proc.poll() is None:
                os.killpg(s.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 25
        for s in reversed(self.svcs):
            if s.proc is None:
                continue
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(s.proc.pid, signal.SIGKILL)
                s.proc.wait()
            with contextlib.suppress(ProcessLookupError):  # children that outlived it
                os.killpg(s.proc.pid, signal.SIGKILL)
        STATE.unlink(missing_ok=True)


def _box(lines: list[str]) -> str:
    """`lines` in a frame as wide as the longest (every character here is one column)."""
    w = max(len(line) for line in lines)
    return "\n".join([f"  ┌{'─' * (w + 2)}┐", *(f"  │ {line:<{w}} │" for line in lines),
                      f"  └{'─' * (w + 2)}┘"])


BANNER = _box([
    "RANDOM WEIGHTS: the TTS speaks noise and the thinker babbles.",
    "For real speech set VOICE_TTS_WEIGHTS=/path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "(the Hugging Face folder; add ,/path/to/Qwen3-TTS-12Hz-0.6B-Base for clones)",
    "and VOICE_LLM_WEIGHTS=/path/to/a/chat/model.",
])


def up(args: argparse.Namespace) -> int:
    svcs = services()
    mesh = Mesh(svcs)
    mesh.preflight()  # first: a second `make up` says only where the running one is
    print("mesh: starting the local mesh (every service a local process; no Docker engine)")
    if not os.environ.get("VOICE_TTS_WEIGHTS") or not os.environ.get("VOICE_LLM_WEIGHTS"):
        print(BANNER)

    def on_signal(signum: int, _frame: object) -> None:
        mesh.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rc = 0
    try:
        mesh.start()
        print("mesh: up. Services:")
        for s in svcs:
            ports = ", ".join(f"{role} {p}" for role, p in s.ports.items())
            print(f"  {s.name:8s} {ports:28s} log {_rel(s.log)}")
        web = next((s.health_port for s in svcs if s.name == "token"), 8080)
        via = (f"LiveKit at {os.environ['LIVEKIT_URL']}" if os.environ.get("LIVEKIT_URL")
               else "the agent's WebSocket, no LiveKit")
        print(f"  web page: http://127.0.0.1:{web}/ ({via})   stop: Ctrl-C or `make down`",
              flush=True)
        rc = mesh.watch()
    except RuntimeError as e:
        print(f"mesh: {e}", file=sys.stderr)
        rc = 1
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        print("mesh: stopping every service", flush=True)
        mesh.stop()
        print("mesh: stopped", flush=True)
    return rc


def down(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("mesh: not running")
        return 0
    state = json.loads(STATE.read_text())
    pid = state["supervisor"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        STATE.unlink(missing_ok=True)
        print("mesh: supervisor already gone")
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("mesh: stopped")
            return 0
        time.sleep(0.2)
    print(f"mesh: supervisor {pid} still running after {args.timeout} s", file=sys.stderr)
    return 1


def main() -> None:
    p = argparse.ArgumentParser(prog="mesh.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start every service and supervise them (foreground)")
    d = sub.add_parser("down", help="stop a running mesh")
    d.add_argument("--timeout", type=float, default=40.0)
    args = p.parse_args()
    sys.exit(up(args) if args.cmd == "up" else down(args))


if __name__ == "__main__":
    main()
