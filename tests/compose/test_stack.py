"""The cpu profile of compose.yaml, run by the real Docker Compose v2 from images built from
this checkout, checked from outside the way a user meets it: published ports on
127.0.0.1, `make demo`, the token page, the page talking in headless Chromium (a fake
microphone) to the agent's WebSocket, the thinker's gRPC, Prometheus's HTTP API, a crashed
process restarted by Compose, and `down -v` leaving nothing behind.

The optional services run when their images are here (VOICE_TEST_OPTIONAL, from run.sh):
Prometheus always (`make images-local` builds one), LiveKit and Grafana only when their
registry images can be had. Without LiveKit the page talks to the agent's WebSocket, as
`docker compose --profile cpu up` gives it. The stack's host ports are free ones, through
the port variables compose.yaml reads (TTS_GRPC_PORT, ...), so a running `make up` mesh
does not stand in the way.

Run by `make test-compose` (tests/compose/run.sh builds the images first); skipped in
`make test`. The tests share one stack and run in file order.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests
from voice_testkit import free_ports

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "voice-test"
OPTIONAL = set(os.environ.get("VOICE_TEST_OPTIONAL", "").lower().split())
PROFILES = ["cpu", "prometheus", *sorted({"livekit", "grafana"} & OPTIONAL)]
SERVICES = ["tts-cpu", "llm-cpu", "token", "agent", "prometheus",
            *sorted({"livekit", "grafana"} & OPTIONAL)]
LIVEKIT = "livekit" in OPTIONAL


# The host ports compose.yaml publishes the core on (its port variables), free ones here.
PORT_VARS = ("TTS_GRPC_PORT", "TTS_HTTP_PORT", "LLM_GRPC_PORT", "LLM_HTTP_PORT",
             "AGENT_HTTP_PORT", "TOKEN_HTTP_PORT")
PORT = dict(zip(PORT_VARS, free_ports(len(PORT_VARS)), strict=True))
TTS_HTTP = f"http://127.0.0.1:{PORT['TTS_HTTP_PORT']}"
TOKEN_HTTP = f"http://127.0.0.1:{PORT['TOKEN_HTTP_PORT']}"
# Fixed host ports of the optional services (LiveKit and Grafana on VOICE_BIND).
FIXED_PORTS = {"prometheus": [9090], "livekit": [7880], "grafana": [3000]}
# Prometheus jobs (deploy/prometheus/prometheus.yml) of the services that run here.
JOBS_UP = {"tts", "llm", "agent", "token", "prometheus", *({"livekit"} & OPTIONAL)}
ENV_EXAMPLE = dict(
    line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
    if line and not line.startswith("#"))

pytestmark = pytest.mark.skipif(not os.environ.get("VOICE_TEST_COMPOSE"),
                                reason="run by `make test-compose` (needs a Docker engine)")


# Keys on, as `make up` writes them into .env: the TTS and the thinker ask for this one,
# the agent sends it (the shell's value wins over --env-file's empty one).
KEY = "compose-test-key-" + "0123456789abcdef" * 2
AUTH = {"Authorization": f"Bearer {KEY}"}


def compose(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    profiles = [a for p in PROFILES for a in ("--profile", p)]
    env = {**os.environ, "VOICE_API_KEY": KEY, **{k: str(v) for k, v in PORT.items()},
           # the cpu profile's one agent process, as `make up` runs it (deploy/sizing.py)
           "AGENT_PROCS": "1", "AGENT_WS_MAX_SESSIONS": "4",
           # LiveKit on: the browsers' URL (the agent joins it as a worker); off: empty
           "LIVEKIT_PUBLIC_URL": "ws://localhost:7880" if LIVEKIT else ""}
    proc = subprocess.run(
        ["docker", "compose", "-p", PROJECT, "--env-file", str(ROOT / ".env.example"),
         *profiles, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker compose {' '.join(args)}: rc={proc.returncode}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def inspect(service: str) -> dict:
    [cid] = compose("ps", "-q", service).stdout.split()
    out = subprocess.run(["docker", "inspect", cid], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]


def wait_for(what: str, predicate, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (requests.RequestException, AssertionError, KeyError) as e:
            last = e
        time.sleep(every)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def project_leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {kind: subprocess.run(["docker", *cmd, "--filter", label], capture_output=True,
                                 text=True, check=True).stdout.split()
            for kind, cmd in (("containers", ["ps", "-aq"]), ("networks", ["network", "ls", "-q"]),
                              ("volumes", ["volume", "ls", "-q"]))}


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    compose("down", "-v", "--remove-orphans", check=False)
    busy = [p for s in SERVICES for p in FIXED_PORTS.get(s, []) if port_in_use(p)]
    assert not busy, f"ports {busy} are taken (a running `make up`?): stop it first"
    missing = sorted({"livekit", "grafana"} - OPTIONAL)
    if missing:
        print(f"\nnot started: {', '.join(missing)} (no image here: their profiles are off; "
              "the page talks to the agent's WebSocket)")
    t0 = time.monotonic()
    # --wait: until every service is running and its healthcheck says healthy. The profiles
    # pick the services, as a user's `docker compose --profile cpu up` does.
    up = compose("up", "-d", "--wait", "--wait-timeout", "420", check=False)
    if up.returncode != 0:
        logs = compose("logs", "--tail", "40", check=False).stdout
        compose("down", "-v", check=False)
        raise AssertionError(f"compose up failed:\n{up.stderr}\n{logs}")
    print(f"up and healthy in {time.monotonic() - t0:.0f} s: {' '.join(SERVICES)}")
    try:
        yield
    finally:
        compose("down", "-v", "--remove-orphans", check=False)


def test_every_service_is_up_and_healthy(stack):
    running = compose("ps", "--services").stdout.split()
    assert sorted(running) == sorted(SERVICES)
    for service in SERVICES:
        state = inspect(service)["State"]
        assert state["Running"], service
        health = state.get("Health", {}).get("Status")
        assert health == "healthy", f"{service}: {health}"


def test_make_demo_against_the_tts_container_writes_a_valid_wav(stack, tmp_path):
    out = tmp_path / "demo.wav"
    proc = subprocess.run(["make", "--no-print-directory", "demo", f"DEMO_OUT={out}",
                           "TEXT=Hello from the container."],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TTS_API_KEY": KEY,
                               "TTS_GRPC_PORT": str(PORT["TTS_GRPC_PORT"])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        frames = w.getnframes()
        pcm = w.readframes(frames)
    assert frames >= 24000 * 0.2, f"only {frames} samples"
    assert any(pcm), "all silence"


def test_the_tts_container_speaks_openai_http(stack):
    body = {"model": "tts-1", "input": "Hello over HTTP.", "voice": "vivian", "stream": False}
    r = requests.post(f"{TTS_HTTP}/v1/audio/speech", timeout=30, json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    r = requests.post(f"{TTS_HTTP}/v1/audio/speech", timeout=120, json=body,
                      headers=AUTH)
    assert r.status_code == 200, r.text
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getframerate() == 24000 and w.getnframes() >= 1920
    bad = requests.post(f"{TTS_HTTP}/v1/audio/speech", timeout=30,
                        json={"input": "Hi", "voice": "alloy"}, headers=AUTH)
    assert bad.status_code == 404 and "unknown voice" in bad.json()["error"]["message"]


def test_the_token_page_and_a_signed_token_come_from_the_token_container(stack):
    page = requests.get(f"{TOKEN_HTTP}/", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
    bundle = requests.get(f"{TOKEN_HTTP}/static/dist/app.js", timeout=10)
    assert bundle.status_code == 200 and len(bundle.content) > 100_000  # livekit-client inside
    if not LIVEKIT:  # the page talks to the agent's WebSocket; no tokens to hand out
        assert 'data-transport="websocket"' in page.text
        ws = f"ws://127.0.0.1:{PORT['AGENT_HTTP_PORT']}/v1/talk"
        assert f'data-agent-ws-url="{ws}"' in page.text
        r = requests.post(f"{TOKEN_HTTP}/api/token", timeout=10,
                          json={"room": "compose-test", "identity": "web-alice"})
        assert r.status_code == 409 and "TOKEN_AGENT_WS_URL" in r.json()["error"], r.text
        return
    assert 'data-transport="livekit"' in page.text
    # a stranger gets the page's kind of identity, not one of the app's users
    r = requests.post(f"{TOKEN_HTTP}/api/token", timeout=10,
                      json={"room": "compose-test", "identity": "admin"})
    assert r.status_code == 403 and r.json()["field"] == "identity", r.text
    r = requests.post(f"{TOKEN_HTTP}/api/token", timeout=10,
                      json={"room": "compose-test", "identity": "web-alice"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["server_url"] == "ws://localhost:7880"
    header, payload, signature = body["participant_token"].split(".")
    unb64 = lambda s: base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))  # noqa: E731
    expected = hmac.new(ENV_EXAMPLE["LIVEKIT_API_SECRET"].encode(),
                        f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(unb64(signature), expected), "not signed with the .env secret"
    claims = json.loads(unb64(payload))
    assert claims["iss"] == ENV_EXAMPLE["LIVEKIT_API_KEY"] and claims["sub"] == "web-alice"
    assert claims["video"]["room"] == "compose-test" and claims["video"]["roomJoin"] is True
    bad = requests.post(f"{TOKEN_HTTP}/api/token", json={"room": "x"}, timeout=10)
    assert bad.status_code == 400


def test_the_thinker_answers_through_its_container(stack):
    from voice.llm.v1 import thinker_pb2 as pb
    from voice.llm.v1 import thinker_pb2_grpc as rpc

    request = pb.ChatRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text="Say hello.")])],
        max_tokens=12, temperature=0.0)
    with grpc.insecure_channel(f"127.0.0.1:{PORT['LLM_GRPC_PORT']}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            list(rpc.ThinkerStub(channel).Chat(request, timeout=60))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        deltas = list(rpc.ThinkerStub(channel).Chat(
            request, timeout=60, metadata=(("authorization", f"Bearer {KEY}"),)))
    final = deltas[-1].final
    assert final.completion_tokens > 0 and final.ttft_ms > 0
    assert "".join(d.text for d in deltas), "no text"


def test_the_page_talks_to_the_agent_over_its_websocket(stack, tmp_path):
    """As tests/mesh/test_mesh_page.py, against the containers: headless Chromium, its fake
    microphone playing espeak-ng speech, the page served by the token container, the agent
    container's /v1/talk. The greeting, then the user's words transcribed (PocketSphinx in
    the agent image) and an audible reply."""
    if LIVEKIT:
        pytest.skip("LiveKit runs: the page uses LiveKit (no browser test for it here)")
    pytest.importorskip("playwright.sync_api")
    sys.path.insert(0, str(ROOT / "tests" / "mesh"))
    from test_mesh_page import CHROMIUM, assert_conversation, mic_wav, page_conversation

    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run services/token/setup.sh (apt chromium)")
    shot = ROOT / "artifacts" / "compose" / "page_websocket_conversation.png"
    assert_conversation(page_conversation(mic_wav(tmp_path), f"{TOKEN_HTTP}/", shot))


def _targets() -> dict[str, str]:
    r = requests.get("http://127.0.0.1:9090/api/v1/targets", timeout=5)
    r.raise_for_status()
    return {t["labels"]["job"]: t["health"] for t in r.json()["data"]["activeTargets"]}


def _query(expr: str) -> float:
    r = requests.get("http://127.0.0.1:9090/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def test_prometheus_scrapes_every_service_and_sees_the_demo(stack):
    def all_up() -> dict[str, str] | None:
        targets = _targets()
        return targets if all(targets.get(job) == "up" for job in JOBS_UP) else None

    targets = wait_for("every running service's target up", all_up, timeout=90)
    down = sorted(j for j, h in targets.items() if h != "up")
    print(f"targets up: {sorted(JOBS_UP)}; down (not run here): {down}")
    assert set(down) <= {"livekit", "dcgm"}
    # The demo (an earlier test) spoke at least one utterance through the TTS container.
    count = wait_for("tts_ttfa_seconds samples", lambda: _query("sum(tts_ttfa_seconds_count)"),
                     timeout=60)
    assert count >= 1


def test_a_killed_tts_process_is_restarted_by_compose_and_gets_healthy(stack):
    before = inspect("tts-cpu")
    pid = before["State"]["Pid"]
    # The process itself, from the host: `docker kill` would count as a manual stop, which
    # the restart policy respects.
    os.kill(pid, signal.SIGKILL)

    def restarted_and_healthy():
        state = inspect("tts-cpu")
        return (state["RestartCount"] > before["RestartCount"] and state["State"]["Pid"] != pid
                and state["State"]["Health"]["Status"] == "healthy")

    t0 = time.monotonic()
    wait_for("tts-cpu restarted and healthy", restarted_and_healthy, timeout=240, every=2)
    print(f"tts-cpu restarted and healthy {time.monotonic() - t0:.0f} s after SIGKILL")
    assert requests.get(f"{TTS_HTTP}/healthz", timeout=5).status_code == 200


def test_down_removes_every_container_network_and_volume(stack):
    assert any(project_leftovers().values())
    compose("down", "-v")
    assert project_leftovers() == {"containers": [], "networks": [], "volumes": []}
