"""Shared fixtures: settings with known test credentials, the app on a real localhost
port (aiohttp's test server), a real `python -m voice_token` subprocess, and the page's
headless browser (Debian's chromium, driven by playwright).

No LiveKit server runs here (no binary installs on these machines): LIVEKIT_URL points at
a closed localhost port, which is exactly the "cannot reach server" case the page must
handle. Nothing in these tests fakes the token service itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from voice_testkit import free_port, stop_process
from voice_token.app import build_app
from voice_token.settings import Settings, load_settings

API_KEY = "APItestkey123"
# A sentinel we can grep for: it must never appear in logs, responses or errors.
API_SECRET = "s3cr3t-SENTINEL-0123456789abcdefghijklmnop"
REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "artifacts" / "token"
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium floods this machine's closed network.
# The fake media flags: a synthetic microphone, granted without a prompt.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own LIVEKIT_*/TOKEN_* must not leak into the tests.
    for var in list(os.environ):
        if var.startswith(("LIVEKIT_", "TOKEN_")):
            monkeypatch.delenv(var)


def make_settings(**overrides: object) -> Settings:
    # Any identity: these tests are about other things (test_grants.py holds the shipped
    # TOKEN_IDENTITIES default, and what a caller with or without a key may have).
    base: dict[str, object] = {
        "livekit_api_key": API_KEY, "livekit_api_secret": API_SECRET,
        "livekit_url": "ws://127.0.0.1:7880", "token_identities": "*",
    }
    base.update(overrides)
    return load_settings(**base)


@pytest.fixture
def client_for(aiohttp_client):  # type: ignore[no-untyped-def]
    """client_for(**settings) -> aiohttp TestClient on a real 127.0.0.1 port."""

    async def make(**overrides: object):  # type: ignore[no-untyped-def]
        return await aiohttp_client(build_app(make_settings(**overrides)))

    return make


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def start_server(tmp: Path, **env: str) -> ServerProcess:
    """Run `python -m voice_token` with test credentials; wait for /healthz."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "TOKEN_"))}
    full_env.update({
        "LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": API_SECRET,
        "TOKEN_HTTP_HOST": "127.0.0.1", "TOKEN_HTTP_PORT": str(port),
    })
    full_env.update(env)
    log_path = tmp / f"server-{port}.log"
    with open(log_path, "w") as log:  # the child keeps its own copy of the fd
        proc = subprocess.Popen(
            [sys.executable, "-m", "voice_token"], env=full_env, stdout=log,
            stderr=subprocess.STDOUT, text=True,
        )
    server = ServerProcess(proc, port, log_path, full_env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"voice_token exited {proc.returncode}:\n{server.logs()}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(server.url + "/healthz", timeout=1).read()
            return server
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"voice_token did not answer /healthz in 20 s:\n{server.logs()}")


def stop_server(server: ServerProcess, timeout: float = 10) -> int:
    return stop_process(server.proc, timeout)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    started: list[ServerProcess] = []

    def make(**env: str) -> ServerProcess:
        s = start_server(tmp_path, **env)
        started.append(s)
        return s

    yield make
    for s in started:
        stop_server(s)


# Per module, not per session: playwright's sync API holds an event loop while it runs,
# and the aiohttp tests of later modules need theirs.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run services/token/setup.sh (apt chromium)")
    # Rebuild the bundle if web/src changed since setup.sh ran (a no-op otherwise).
    subprocess.run(["bash", str(REPO / "services/token/web/build.sh")], check=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        # launch() gives every run a fresh temporary profile (its own --user-data-dir).
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1000, "height": 720})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # The page's CSP must not block anything the page itself does.
    pg.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text
          else None)
    yield pg
    ctx.close()
    assert errors == [], f"uncaught errors / CSP violations in the page: {errors}"


def shot(page: Page, name: str) -> None:
    """Keep a screenshot as a test artifact (artifacts/token/NAME.png), checked to be a PNG."""
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, path
