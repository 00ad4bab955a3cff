"""`make up` without Docker: the local mesh starts every service, the README's own-voice
lines clone a voice, the demos speak (in the clone and a preset), `make down`
stops everything and frees every port; a service that cannot start stops the mesh with a
message naming it and the cause.

Runs the real services from their venvs with tiny random models (the venvs come from
`make venvs`, which `make test` builds first).
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import subprocess
import sys
import time
import wave
from pathlib import Path

import pytest
from voice_testkit import free_ports

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "local"))
from mesh import port_free  # noqa: E402  (the launcher's own check: the same rule)

PORT_VARS = ("TTS_GRPC_PORT", "TTS_HTTP_PORT", "LLM_GRPC_PORT", "LLM_HTTP_PORT",
             "TOKEN_HTTP_PORT", "AGENT_HTTP_PORT")

pytestmark = pytest.mark.skipif(
    not all((ROOT / ".venv" / v / "bin/python").exists() for v in ("tts", "llm", "token", "agent")),
    reason="service venvs missing (make venvs)")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every practical purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.fixture
def mesh_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, **dict(zip(PORT_VARS, map(str, free_ports(len(PORT_VARS))),
                                    strict=True))}
    env["MESH_RUN_DIR"] = str(tmp_path / "run")
    # The mesh, even where a Docker engine and Compose answer (`make up` would pick them).
    env["VOICE_UP"] = "mesh"
    return env


def test_up_demo_down(mesh_env: dict[str, str], tmp_path: Path) -> None:
    up = subprocess.Popen(["make", "--no-print-directory", "up"], cwd=ROOT, env=mesh_env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "mesh: up" in line:
                break
        out = "".join(lines)
        assert "mesh: up" in out, out
        assert "local mesh" in out.splitlines()[0] + out.splitlines()[1], "says which path"
        assert "RANDOM WEIGHTS" in out
        state = json.loads((Path(mesh_env["MESH_RUN_DIR"]) / "mesh.json").read_text())
        pids = [s["pid"] for s in state["services"].values()]
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
        again = subprocess.run(["python3", "deploy/local/mesh.py", "up"], cwd=ROOT,
                               env=mesh_env, capture_output=True, text=True, timeout=60)
        # a second `make up` shows the running stack, not an error
        assert again.returncode == 0 and "already running" in again.stdout, again.stderr
        # ... and only that: no "starting" line nor the random-weights banner before it
        assert "RANDOM WEIGHTS" not in again.stdout and "starting" not in again.stdout
        assert "Nothing to be done" not in out  # a warm `make up` says no make noise
        web = state["services"]["token"]["ports"]
        assert f"web page http://127.0.0.1:{next(iter(web.values()))}/" in again.stdout
        assert "`make down`" in again.stdout

        # the README's own-voice lines (they answered 501 on this stack), then `make demo`
        # speaks in the cloned voice (demo-chat below speaks in the preset one)
        own_voice(mesh_env, tmp_path)
        demo = tmp_path / "demo.wav"
        r = subprocess.run(["make", "--no-print-directory", "demo", f"DEMO_OUT={demo}",
                            "TEXT=Hello from the local mesh.", "VOICE=alice",
                            "DEMO_ARGS=--greedy --max-frames 10"],
                           cwd=ROOT, env=mesh_env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "TTFA" in r.stdout and "RTF" in r.stdout
        with wave.open(str(demo)) as w:
            assert w.getframerate() == 24000 and w.getnframes() == 10 * 1920

        chat = tmp_path / "chat.wav"
        r = subprocess.run(["make", "--no-print-directory", "demo-chat", f"CHAT_OUT={chat}",
                            "ASK=Say hi.", "DEMO_ARGS=--max-frames 8"],
                           cwd=ROOT, env=mesh_env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "thinker:" in r.stdout
        with wave.open(str(chat)) as w:
            assert w.getframerate() == 24000 and w.getnframes() > 0

        r = subprocess.run(["make", "--no-print-directory", "down"], cwd=ROOT, env=mesh_env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert up.wait(60) == 0
        assert not any(pid_alive(p) for p in pids), "a service outlived `make down`"
        ports = [int(mesh_env[v]) for v in PORT_VARS]
        taken = [p for p in ports if not port_free(p)]
        assert not taken, f"ports still taken after `make down`: {taken}"
    finally:
        if up.poll() is None:
            os.killpg(up.pid, 9)


def readme_own_voice_lines() -> str:
    """The README's "Your own voice" commands, as a user pastes them."""
    text = (ROOT / "README.md").read_text()
    after = text.split("**Your own voice.**", 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    curls, _ = block.split("make demo VOICE=alice", 1)  # the test runs `make demo` itself
    assert "audio_sample=@alice.wav" in curls and '"voice": "alice"' in curls, block
    return curls


def reference_wav(path: Path, seconds: float = 4.0, rate: int = 16000) -> None:
    """A short "recording": a vowel-like tone with vibrato (the server wants 3-30 s)."""
    n = int(seconds * rate)
    pcm = b"".join(struct.pack("<h", int(6000 * math.sin(
        2 * math.pi * (180 * i / rate + 2 * math.sin(2 * math.pi * 5 * i / rate)))
        * (0.6 + 0.4 * math.sin(2 * math.pi * 3 * i / rate)))) for i in range(n))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def own_voice(env: dict[str, str], tmp_path: Path) -> None:
    """The README's own-voice lines on the stack `make up` started: alice is made from a
    short WAV and speaks over HTTP."""
    work = tmp_path / "own-voice"
    work.mkdir()
    reference_wav(work / "alice.wav")
    lines = readme_own_voice_lines().replace("localhost:8001",
                                             f"localhost:{env['TTS_HTTP_PORT']}")
    # each command's response on a line of its own (the first prints the voice's JSON)
    r = subprocess.run(["bash", "-ec", lines + "\necho"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    created = json.loads(r.stdout.strip().splitlines()[0])
    assert created.get("name") == "alice" and created.get("success"), r.stdout
    with wave.open(str(work / "hello.wav")) as w:
        assert w.getframerate() == 24000 and w.readframes(1920), "no audio in alice's voice"


def test_taken_port_stops_the_mesh_with_a_clear_message(mesh_env: dict[str, str]) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", int(mesh_env["LLM_GRPC_PORT"])))
    blocker.listen()
    try:
        r = subprocess.run(["python3", "deploy/local/mesh.py", "up"], cwd=ROOT, env=mesh_env,
                           capture_output=True, text=True, timeout=120)
    finally:
        blocker.close()
    assert r.returncode != 0
    assert "thinker" in r.stderr and mesh_env["LLM_GRPC_PORT"] in r.stderr and "taken" in r.stderr
    assert "LLM_GRPC_PORT=" in r.stderr, r.stderr  # names the variable that moves it


def test_service_failing_at_start_stops_everything(mesh_env: dict[str, str]) -> None:
    env = {**mesh_env, "LLM_MAX_CONCURRENT": "not-a-number"}
    r = subprocess.run(["python3", "deploy/local/mesh.py", "up"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=400)
    assert r.returncode != 0
    assert "thinker exited" in r.stderr and "max_concurrent" in r.stderr.lower(), r.stderr
    # tts had started before the thinker failed: it must be gone, its ports free.
    assert "mesh: stopped" in r.stdout
    for v in ("TTS_GRPC_PORT", "TTS_HTTP_PORT"):
        assert port_free(int(mesh_env[v])), f"{v} still taken"
