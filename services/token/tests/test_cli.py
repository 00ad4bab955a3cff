"""`python -m voice_token` as a real process: --help, fail-fast config, serving the page,
token API, /healthz and /metrics, JSON logs with request ids, graceful SIGTERM, and the
API secret never in any log line or response."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from conftest import API_KEY, API_SECRET, stop_server
from livekit.api import TokenVerifier


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "TOKEN_"))}
    return subprocess.run([sys.executable, "-m", "voice_token", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=30)


def test_help_lists_the_env() -> None:
    r = _run("--help")
    assert r.returncode == 0
    for var in ("LIVEKIT_URL", "LIVEKIT_API_SECRET", "TOKEN_HTTP_PORT", "TOKEN_TTL_SECONDS",
                "TOKEN_CORS_ORIGINS", "TOKEN_RATE_LIMIT_PER_MINUTE", "TOKEN_AGENT_NAME"):
        assert var in r.stdout


def test_missing_credentials_exit_2_with_a_clear_message() -> None:
    r = _run()
    assert r.returncode == 2
    assert "LIVEKIT_API_KEY (or LIVEKIT_API_KEY_FILE) is required" in r.stderr


def test_bad_value_exit_2_without_the_secret() -> None:
    r = _run(LIVEKIT_API_KEY=API_KEY, LIVEKIT_API_SECRET=API_SECRET, TOKEN_TTL_SECONDS="5")
    assert r.returncode == 2
    assert "TOKEN_TTL_SECONDS" in r.stderr
    assert API_SECRET not in r.stderr + r.stdout


def test_check_config_masks_the_secret() -> None:
    r = _run("--check-config", LIVEKIT_API_KEY=API_KEY, LIVEKIT_API_SECRET=API_SECRET)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["LIVEKIT_API_SECRET"] == "<set>" and out["TOKEN_HTTP_PORT"] == 8080
    assert API_SECRET not in r.stdout + r.stderr


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "X-Request-Id": "req-test-42"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serves_and_stops_gracefully_on_sigterm(server_factory) -> None:  # type: ignore[no-untyped-def]
    srv = server_factory(LIVEKIT_URL="ws://127.0.0.1:7999", TOKEN_TTL_SECONDS="300")
    answers = []

    status, body = _get(srv.url + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "SERVING"
    assert json.loads(body)["page_bundle"] is True
    with urllib.request.urlopen(srv.url + "/", timeout=5) as r:
        status, page, csp = r.status, r.read().decode(), r.headers["Content-Security-Policy"]
    assert status == 200 and "<title>Voice agent</title>" in page
    assert "script-src 'self'" in csp and "<script>" not in page  # no inline script
    assert 'data-connect-timeout-ms="15000"' in page  # filled from the settings
    assert 'data-agent-timeout-ms="10000"' in page
    status, js = _get(srv.url + "/static/dist/app.js")
    assert status == 200 and len(js) > 100_000  # the bundled LiveKit client
    assert _get(srv.url + "/static/../settings.py")[0] == 404

    status, body = _post(srv.url + "/api/token", b'{"room": "demo", "identity": "web-1a2b3c4d"}')
    assert status == 200
    out = json.loads(body)
    claims = TokenVerifier(API_KEY, API_SECRET).verify(out["participant_token"])
    assert claims.video is not None and claims.video.room == "demo"
    assert out["server_url"] == "ws://127.0.0.1:7999"
    answers.append(body)
    status, body = _post(srv.url + "/api/token", b'{"room": "bad room"}')
    assert status == 400
    answers.append(body)

    status, metrics = _get(srv.url + "/metrics")
    assert status == 200
    assert 'token_requests_total{status="200"} 1.0' in metrics
    assert 'token_requests_total{status="400"} 1.0' in metrics
    answers.append(metrics)

    t0 = time.monotonic()
    assert stop_server(srv) == 0
    assert time.monotonic() - t0 < 5

    lines = [json.loads(line) for line in srv.logs().splitlines() if line.startswith("{")]
    msgs = [line["msg"] for line in lines]
    assert msgs[0] == "config" and "listening" in msgs
    assert msgs[-2:] == ["shutting down", "stopped"]
    req_lines = [ln for ln in lines if ln["msg"] == "request" and ln["path"] == "/api/token"]
    assert [(r["status"], r["request_id"]) for r in req_lines] == [
        (200, "req-test-42"), (400, "req-test-42")]
    assert req_lines[0]["room"] == "demo" and req_lines[0]["identity"] == "web-1a2b3c4d"
    # The secret is in the process env, and nowhere it writes or answers.
    assert API_SECRET not in srv.logs()
    assert all(API_SECRET not in a for a in answers)
    assert out["participant_token"] not in srv.logs()  # tokens are not logged either
