"""deploy/k8s: valid against the Kubernetes schemas, and wired together as deploy/README.md says.

kubernetes-validate (PyPI, schemas bundled, offline) checks every resource in strict
mode (an unknown field fails); `kubectl kustomize` renders the kustomization when kubectl
is installed. The rest checks the wiring schemas cannot see: selectors, named ports,
GPU pool placement, env names the services read, the Envoy clusters' targets, and the
HPA metrics being ones our services export.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_support import (
    K8S,
    KNOWN_METRICS,
    ROOT,
    SETTINGS,
    settings_env_names,
    unfetched_model_dirs,
)

VALIDATOR = Path(sys.executable).parent / "kubernetes-validate"
# Not Kubernetes resources: the kustomization and a Helm values file.
NOT_RESOURCES = {"kustomization.yaml", "prometheus-adapter-values.yaml"}
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name not in NOT_RESOURCES)
GPU_WORKLOADS = {"tts", "llm"}
# Secrets the user creates (not in the kustomization): file -> the Secret's name.
EXAMPLES = {"livekit-secret.example.yaml": "livekit-credentials",
            "api-keys-secret.example.yaml": "voice-api-keys"}


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def resources() -> dict[tuple[str, str], dict]:
    """(kind, name) -> resource, over every manifest."""
    out = {}
    for path in MANIFESTS:
        for doc in load(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} defined twice"
            out[key] = doc
    return out


def by_kind(resources: dict, kind: str) -> dict[str, dict]:
    return {name: r for (k, name), r in resources.items() if k == kind}


def run_validator(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(VALIDATOR), "--strict", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_manifests_validate_against_the_kubernetes_schemas():
    assert VALIDATOR.exists(), "kubernetes-validate missing from the tools venv"
    assert len(MANIFESTS) >= 8
    proc = run_validator(*MANIFESTS)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # An unknown kind only warns: every resource here must have had a schema.
    assert "Couldn't find schema" not in out, out
    assert out.count("passed for resource") == sum(len(load(p)) for p in MANIFESTS), out


def test_the_validator_rejects_a_wrong_type_and_an_unknown_field(tmp_path):
    text = (K8S / "tts.yaml").read_text()
    wrong_type = tmp_path / "wrong-type.yaml"
    wrong_type.write_text(text.replace("replicas: 1", "replicas: one", 1))
    unknown = tmp_path / "unknown-field.yaml"
    unknown.write_text(text.replace("  replicas: 1", "  replica: 1", 1))
    for bad in (wrong_type, unknown):
        assert run_validator(bad).returncode != 0, f"{bad.name} passed"


def test_kustomization_lists_every_manifest_and_renders():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    top = {p.name for p in K8S.glob("*.yaml")} - NOT_RESOURCES - set(EXAMPLES)
    assert set(kust["resources"]) == top
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed: the rendering half is skipped")
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert len(rendered) == sum(len(load(K8S / r)) for r in kust["resources"])
    assert {d["metadata"].get("namespace", "voice") for d in rendered} == {"voice"}


def test_the_api_key_secret_reaches_both_servers_and_the_agent_that_calls_them(resources):
    """As compose does with VOICE_API_KEY: the TTS and the thinker ask for the key, the
    agent sends it, all from one optional Secret (absent: no keys, no failed pods)."""
    workloads = by_kind(resources, "Deployment")
    wanted = {"tts": {"TTS_API_KEYS"}, "llm": {"LLM_API_KEYS"},
              "agent": {"AGENT_TTS_API_KEY", "AGENT_LLM_API_KEY"}}
    secret = by_kind(resources, "Secret")["voice-api-keys"]
    for name, names in wanted.items():
        env = {e["name"]: e for c in containers(workloads[name]) for e in c.get("env", [])}
        for var in names:
            ref = env[var]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref.get("optional") is True
            assert ref["key"] in secret["stringData"], var


def containers(workload: dict) -> list[dict]:
    return workload["spec"]["template"]["spec"]["containers"]


def test_workload_selectors_ports_and_probes_line_up(resources):
    workloads = by_kind(resources, "Deployment")
    assert {"tts", "llm", "agent", "token", "grpc-lb"} <= set(workloads)
    for name, dep in workloads.items():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        for key, value in dep["spec"]["selector"]["matchLabels"].items():
            assert labels.get(key) == value, f"{name}: selector does not match its pods"
        for c in containers(dep):
            named = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    assert port in named, f"{name}: {probe} uses unknown port {port}"
    # Every Service selects pods that exist, on ports those pods name.
    for name, svc in by_kind(resources, "Service").items():
        pods = [d for d in workloads.values()
                if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                       for k, v in svc["spec"]["selector"].items())]
        assert pods, f"Service {name} selects no Deployment"
        named = {p["name"] for c in containers(pods[0]) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str):
                assert target in named, f"Service {name}: targetPort {target} not on the pods"


def test_gpu_workloads_run_on_the_gpu_pool_and_others_do_not(resources):
    for name, dep in by_kind(resources, "Deployment").items():
        spec = dep["spec"]["template"]["spec"]
        gpus = [c["resources"].get("limits", {}).get("nvidia.com/gpu") for c in spec["containers"]]
        if name in GPU_WORKLOADS:
            assert gpus == [1], f"{name}: one GPU per pod"
            assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
        else:
            assert not any(gpus), f"{name} asks for a GPU"
            assert "nvidia.com/gpu" not in str(spec.get("tolerations", ""))
        sc = spec.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True, f"{name} may run as root"


@pytest.mark.parametrize("service", sorted(SETTINGS))
def test_deployment_env_names_are_settings_the_service_reads(resources, service):
    prefix, rel = SETTINGS[service]
    if not (ROOT / rel).exists():
        pytest.skip(f"{rel} does not exist yet")
    known = settings_env_names(ROOT / rel)
    dep = by_kind(resources, "Deployment")[service]
    names = {e["name"] for c in containers(dep) for e in c.get("env", [])}
    ours = {n for n in names if n.startswith((prefix, "LIVEKIT_"))}
    assert ours, f"{service}: no env"
    unknown = sorted(ours - known)
    assert not unknown, f"{service}: {unknown} are not read by {rel}"


def test_the_models_job_fills_every_directory_the_gpu_servers_load(resources):
    job = resources[("Job", "voice-models-download")]
    fetch = {e["name"]: e.get("value", "") for c in containers(job) for e in c["env"]}
    deps = by_kind(resources, "Deployment")
    env = {n: {e["name"]: e.get("value") for c in containers(deps[n]) for e in c["env"]}
           for n in GPU_WORKLOADS}
    # Presets (CustomVoice) and clones (Base) from one TTS server; designed voices opt-in.
    assert env["tts"]["TTS_MODEL"].split(",") == ["/models/tts", "/models/tts-base"]
    assert fetch["TTS_HF_REPO"].endswith("-CustomVoice")
    assert fetch["TTS_BASE_HF_REPO"].endswith("-Base")
    assert fetch["TTS_DESIGN_HF_REPO"] == ""
    for name, var in (("tts", "TTS_MODEL"), ("llm", "LLM_MODEL")):
        assert not unfetched_model_dirs(env[name][var], fetch), f"{name}: the job leaves them empty"


VOICES_CLAIM = "tts-voices"


def tts_pods(resources: dict) -> dict[str, tuple[dict, dict]]:
    """Every pod template that runs the TTS server (the voice-tts image), whatever the
    workload kind: "kind/name" -> (pod spec, its TTS container)."""
    out = {}
    for (kind, name), r in resources.items():
        spec = r.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            if c.get("image", "").split(":")[0].rsplit("/", 1)[-1] == "voice-tts":
                out[f"{kind}/{name}"] = (spec, c)
    return out


def test_every_tts_pod_shares_one_voice_library_on_a_readwritemany_claim(resources):
    """Envoy spreads sessions over the TTS pods: a voice cloned through one must be on a
    volume every pod mounts (RWX) at its TTS_VOICE_DIR, and the others must follow the
    directory (TTS_VOICE_RESCAN_S, set here, not left to the code's default), or it
    exists on one pod only, or nowhere (no TTS_VOICE_DIR: a create answers 501)."""
    pods = tts_pods(resources)
    assert "Deployment/tts" in pods
    claims = by_kind(resources, "PersistentVolumeClaim")
    assert VOICES_CLAIM in claims, f"no PersistentVolumeClaim {VOICES_CLAIM}"
    assert claims[VOICES_CLAIM]["spec"]["accessModes"] == ["ReadWriteMany"], \
        f"{VOICES_CLAIM}: pods on several nodes need ReadWriteMany"
    for name, (spec, c) in pods.items():
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        voice_dir = env.get("TTS_VOICE_DIR")
        assert voice_dir, f"{name}: no TTS_VOICE_DIR, so no voice library"
        mounts = [m for m in c.get("volumeMounts", [])
                  if m["mountPath"].rstrip("/") == voice_dir.rstrip("/")]
        assert len(mounts) == 1, f"{name}: nothing mounted at TTS_VOICE_DIR={voice_dir}"
        [mount] = mounts
        assert not mount.get("readOnly"), f"{name}: the voice library is mounted read-only"
        volume = {v["name"]: v for v in spec.get("volumes", [])}[mount["name"]]
        claim = volume.get("persistentVolumeClaim", {})
        assert claim.get("claimName") == VOICES_CLAIM, f"{name}: {voice_dir} is not the claim"
        assert not claim.get("readOnly"), f"{name}: the claim is read-only"
        rescan = env.get("TTS_VOICE_RESCAN_S")
        assert rescan is not None and 0 < float(rescan) <= 10, \
            f"{name}: TTS_VOICE_RESCAN_S={rescan!r}: the directory watch must be on (0-10 s)"
        # The server runs as a non-root user: the claim's files are its group's.
        sc = spec.get("securityContext", {})
        assert sc.get("fsGroup") == sc.get("runAsUser"), f"{name}: the library is not writable"


def test_agents_and_token_service_agree_on_livekit_dispatch(resources):
    deps = by_kind(resources, "Deployment")
    env = {n: {e["name"]: e for c in containers(deps[n]) for e in c["env"]}
           for n in ("agent", "token")}
    assert env["agent"]["AGENT_AGENT_NAME"]["value"] == env["token"]["TOKEN_AGENT_NAME"]["value"]
    for name in ("agent", "token"):
        for key in ("LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"):
            ref = env[name][key]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "livekit-credentials"
    assert env["agent"]["AGENT_TTS_ADDR"]["value"] == "tts:50051"
    assert env["agent"]["AGENT_THINKER_ADDR"]["value"] == "llm:50052"


def test_envoy_balances_by_least_request_over_the_headless_services(resources):
    envoy = yaml.safe_load(by_kind(resources, "ConfigMap")["grpc-lb"]["data"]["envoy.yaml"])
    services = by_kind(resources, "Service")
    lb = by_kind(resources, "Deployment")["grpc-lb"]
    lb_ports = {p["name"]: p["containerPort"] for c in containers(lb) for p in c["ports"]}
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    listeners = {ln["name"]: ln for ln in envoy["static_resources"]["listeners"]}
    for name, port in (("tts", 50051), ("llm", 50052)):
        cluster = clusters[name]
        assert cluster["lb_policy"] == "LEAST_REQUEST"
        assert cluster["type"] == "STRICT_DNS"
        assert "http2_protocol_options" in str(cluster["typed_extension_protocol_options"])
        [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        addr = endpoint["endpoint"]["address"]["socket_address"]
        host = addr["address"].split(".")[0]
        headless = services[host]
        assert headless["spec"]["clusterIP"] == "None", f"{host} must be headless"
        assert port in [p["port"] for p in headless["spec"]["ports"]] and addr["port_value"] == port
        # The front Service agents dial reaches this listener.
        assert listeners[name]["address"]["socket_address"]["port_value"] == port
        front = services[name]["spec"]["ports"][0]
        assert front["port"] == port and lb_ports[front["targetPort"]] == port
        route = listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]
        assert route["stream_idle_timeout"] == "0s", "a session would be cut when idle"


def test_hpas_scale_on_metrics_the_services_export(resources):
    hpas = by_kind(resources, "HorizontalPodAutoscaler")
    deployments = by_kind(resources, "Deployment")
    adapter = yaml.safe_load((K8S / "cluster" / "prometheus-adapter-values.yaml").read_text())
    exposed = {r["name"]["as"] for r in adapter["rules"]["custom"]}
    wanted = {"tts": "tts_active_sessions", "llm": "llm_active_requests"}
    for hpa in hpas.values():
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    for name, metric in wanted.items():
        [m] = hpas[name]["spec"]["metrics"]
        assert m["type"] == "Pods" and m["pods"]["metric"]["name"] == metric
        assert metric in KNOWN_METRICS and metric in exposed
    assert hpas["agent"]["spec"]["metrics"][0]["resource"]["name"] == "cpu"
