"""`make up` (deploy/up.sh) picks Docker Compose and its profile, or the local mesh.

The Docker engine is a boundary we cannot reach here: a named fake `docker` on PATH
answers `docker info` / `docker compose version` as told and records the command it
was given; likewise fake `nvidia-smi` and `make`. The script itself runs for real, in a
copy of the repo's layout (so the real checkout gets no .env).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import DEPLOY, ENV_EXAMPLE

FAKE = """#!/bin/sh
# fake {name}: records its arguments, answers with exit code $FAKE_{var}_RC (default 0)
echo "{name} $*" >> "$FAKE_LOG"
exit ${{FAKE_{var}_RC:-0}}
"""


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path / "repo"
    (root / "deploy").mkdir(parents=True)
    shutil.copy(DEPLOY / "up.sh", root / "deploy" / "up.sh")
    shutil.copy(ENV_EXAMPLE, root / ".env.example")
    (root / "deploy" / "localmesh.py").write_text(
        "import sys, os\nopen(os.environ['FAKE_LOG'], 'a').write('localmesh ' + "
        "' '.join(sys.argv[1:]) + '\\n')\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "make"):
        path = bin_dir / name
        path.write_text(FAKE.format(name=name, var=name.upper()))
        path.chmod(0o755)
    for tool in ("bash", "cp", "dirname", "cat"):
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    # A real interpreter, not a shim (pyenv's python3 is a script that needs pyenv).
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_dir), "FAKE_LOG": str(log), "HOME": str(tmp_path)}
    return root, log, env


def up(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "deploy" / "up.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_no_gpu_host_runs_compose_with_the_cpu_profile(layout):
    root, log, env = layout
    proc = up(root, env)
    assert proc.returncode == 0, proc.stderr
    assert calls(log)[-1] == "docker compose --profile cpu up --build --detach --wait"
    # First run: .env is created from .env.example.
    assert (root / ".env").read_text() == ENV_EXAMPLE.read_text()
    assert "cpu profile" in proc.stdout


def test_gpu_host_runs_compose_with_the_profile_from_env(layout):
    root, log, env = layout
    bin_dir = Path(env["PATH"])
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE.format(name="nvidia-smi", var="SMI"))
    smi.chmod(0o755)
    (root / ".env").write_text("COMPOSE_PROFILES=gpu\n")  # an existing .env is kept
    proc = up(root, env)
    assert proc.returncode == 0, proc.stderr
    assert calls(log)[-1] == "docker compose up --build --detach --wait"
    assert (root / ".env").read_text() == "COMPOSE_PROFILES=gpu\n"


def test_an_explicit_profile_wins(layout):
    root, log, env = layout
    proc = up(root, env | {"COMPOSE_PROFILES": "gpu"})
    assert proc.returncode == 0, proc.stderr
    assert calls(log)[-1] == "docker compose up --build --detach --wait"


def test_no_docker_engine_falls_back_to_the_local_mesh(layout):
    root, log, env = layout
    proc = up(root, env | {"FAKE_DOCKER_RC": "1"})  # `docker info`: no engine
    assert proc.returncode == 0, proc.stderr
    made, mesh = calls(log)[-2:]
    assert made.startswith("make ") and all(
        f".venv/{s}/.ok" in made for s in ("tts", "llm", "agent", "token"))
    assert mesh == "localmesh up"
    assert not (root / ".env").exists()
    assert "local mesh" in proc.stdout


def test_the_script_is_what_make_up_runs():
    makefile = DEPLOY.parent / "Makefile"
    if not makefile.exists():
        pytest.skip("no Makefile yet")
    assert "deploy/up.sh" in makefile.read_text()
    assert os.access(DEPLOY / "up.sh", os.R_OK)
