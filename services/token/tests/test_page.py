"""The page in a real headless browser (Debian's chromium, driven by playwright).

It loads, tells a first-time user what to do, asks this service for a token, and shows
its states. No LiveKit server can run
here (named boundary): a closed localhost port stands for "server down" and a TCP
listener that accepts and never answers stands for "server hangs". In both the page must
end in a clear "Cannot reach server" state within its connect timeout, not hang.
Latency figures are fed through the page's own data-message handler
(`window.voiceDemo.receiveData`, the function LiveKit's DataReceived event calls), since
no agent can publish here. The page in a call, over the agent's WebSocket, is
test_page_call.py. Screenshots go to artifacts/token/.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from conftest import API_KEY, API_SECRET, shot
from livekit.api import TokenVerifier
from playwright.sync_api import Page, expect
from voice_testkit import free_port


@contextlib.contextmanager
def hanging_server() -> Iterator[int]:
    """A TCP listener that accepts and never answers: a LiveKit server that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        sock.close()


@contextlib.contextmanager
def fake_livekit_auth(api_key: str, api_secret: str) -> Iterator[tuple[int, list[dict]]]:
    """FAKE (named boundary): stands in for a LiveKit server's token check only, no SFU.
    Like livekit-server, it answers the signal websocket and /rtc/.../validate with 401
    "invalid token" when the token does not verify with ITS key/secret (verified with
    livekit-api's TokenVerifier). Yields (port, seen), seen = what each request carried."""
    seen: list[dict] = []
    verifier = TokenVerifier(api_key, api_secret)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            token = parse_qs(url.query).get("access_token", [""])[0]
            try:
                claims = verifier.verify(token)
                status, body = 503, "fake LiveKit: token valid, but there is no SFU here"
                seen.append({"path": url.path, "valid": True, "room": claims.video.room})
            except Exception as e:
                status, body = 401, f"invalid token: {token[:8]}..., error: {e}"
                seen.append({"path": url.path, "valid": False})
            self.send_response(status)
            self.send_header("Access-Control-Allow-Origin", "*")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_page_loads_asks_for_a_token_and_shows_cannot_reach_server(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    closed = free_port()  # nothing listens here: LiveKit is down
    srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{closed}")
    page.goto(srv.url + "/?room=test-room")
    expect(page.locator("#state")).to_have_attribute("data-state", "idle")
    expect(page.locator("#state-label")).to_have_text("Ready")
    expect(page.locator("#room")).to_have_value("test-room")
    expect(page.locator("#mute")).to_be_disabled()
    # before joining, the page says what to do
    howto = page.locator("#howto")
    expect(howto).to_be_visible()
    expect(howto).to_contain_text("Press Join")
    expect(howto).to_contain_text("Allow the microphone when the browser asks")
    expect(howto).to_contain_text("To interrupt it, just talk")
    expect(page.locator("#state-detail")).to_contain_text("allow the microphone")
    identity = page.locator("#identity").inner_text()
    assert identity.startswith("web-")
    expect(page.locator("#name")).to_have_count(0)  # no field that nothing uses
    shot(page, "page_idle")

    t0 = time.monotonic()
    with page.expect_response("**/api/token") as resp_info:
        page.click("#join")
    resp = resp_info.value
    assert resp.status == 200
    sent = json.loads(resp.request.post_data or "{}")
    assert sent == {"room": "test-room", "identity": identity}
    assert resp.json()["server_url"] == f"ws://127.0.0.1:{closed}"

    expect(page.locator("#state")).to_have_attribute("data-state", "unreachable", timeout=10_000)
    elapsed = time.monotonic() - t0
    expect(page.locator("#state-label")).to_have_text("Cannot reach server")
    expect(page.locator("#state-detail")).to_contain_text(f"ws://127.0.0.1:{closed}")
    expect(page.locator("#state-detail")).to_contain_text("Is the LiveKit server running")
    expect(page.locator("#join")).to_be_enabled()
    expect(page.locator("#join")).to_have_text("Retry")
    expect(page.locator("#mute")).to_be_disabled()
    shot(page, "page_cannot_reach_server")
    # A refused port is reported at once, well before the 15 s connect timeout.
    assert elapsed < 8, f"took {elapsed:.1f} s to report a refused connection"
    print(f"refused LiveKit port reported in {elapsed:.2f} s")


def test_page_shows_connecting_then_gives_up_on_a_hanging_server(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    with hanging_server() as port:
        srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{port}",
                             TOKEN_CONNECT_TIMEOUT_SECONDS="2")
        page.goto(srv.url + "/")
        t0 = time.monotonic()
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "connecting")
        expect(page.locator("#state-label")).to_have_text("Connecting…")
        expect(page.locator("#leave")).to_be_enabled()
        expect(page.locator("#join")).to_be_disabled()
        shot(page, "page_connecting")
        expect(page.locator("#state")).to_have_attribute("data-state", "unreachable",
                                                         timeout=8_000)
        elapsed = time.monotonic() - t0
        expect(page.locator("#state-detail")).to_contain_text("no answer within 2 s")
    assert 1.8 <= elapsed < 6, f"gave up after {elapsed:.1f} s, configured 2 s"
    print(f"hanging LiveKit server given up after {elapsed:.2f} s (timeout 2 s)")


def test_page_shows_refused_when_livekit_rejects_the_token(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    # The token service signs with the test secret; this "LiveKit" has another one:
    # the key/secret mismatch a deployer gets wrong most often.
    with fake_livekit_auth(API_KEY, "a-different-secret-0123456789abcdefghij") as (port, seen):
        srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{port}")
        page.goto(srv.url + "/?room=secure-room")
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "refused", timeout=10_000)
        expect(page.locator("#state-label")).to_have_text("Server refused to connect")
        expect(page.locator("#state-detail")).to_contain_text("rejected the token")
        expect(page.locator("#state-detail")).to_contain_text("LIVEKIT_API_SECRET")
        shot(page, "page_refused")
    # The page did present the token: on the signal socket, then on the validate probe.
    assert seen and all(not s["valid"] for s in seen)
    assert any(s["path"].endswith("/validate") for s in seen), seen


def test_page_presents_a_token_that_livekit_would_accept(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    with fake_livekit_auth(API_KEY, API_SECRET) as (port, seen):
        srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{port}")
        page.goto(srv.url + "/?room=secure-room")
        page.click("#join")
        # The token checks out, but with no SFU behind it the page still ends, clearly,
        # in "Cannot reach server".
        expect(page.locator("#state")).to_have_attribute("data-state", "unreachable",
                                                         timeout=10_000)
    assert seen and all(s["valid"] and s["room"] == "secure-room" for s in seen), seen
    assert seen[0]["path"] == "/rtc/v1"  # the signal websocket, token in its query


def test_page_shows_the_services_error_message(server_factory, page: Page) -> None:  # type: ignore[no-untyped-def]
    srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{free_port()}")
    page.goto(srv.url + "/")
    page.fill("#room", "bad room!")
    page.click("#join")
    expect(page.locator("#state")).to_have_attribute("data-state", "token-error")
    expect(page.locator("#state-label")).to_have_text("Could not get a token")
    expect(page.locator("#state-detail")).to_contain_text("invalid room 'bad room!'")
    shot(page, "page_token_error")


def test_page_shows_latency_from_agent_data_messages(server_factory, page: Page) -> None:  # type: ignore[no-untyped-def]
    srv = server_factory(LIVEKIT_URL=f"ws://127.0.0.1:{free_port()}")
    page.goto(srv.url + "/")
    expect(page.locator("#latency-empty")).to_be_visible()
    turns = [
        {"turn_id": "t1", "eot_to_first_audio_ms": 612.4, "llm_ttft_ms": 95, "tts_ttfa_ms": 180},
        {"turn_id": "t2", "eot_to_first_audio_ms": 480, "llm_ttft_ms": 70.2},  # no tts field
        {"turn_id": "t3", "eot_to_first_audio_ms": 530, "llm_ttft_ms": 82, "tts_ttfa_ms": 150,
         "extra": "ignored"},
    ]
    for t in turns:
        assert page.evaluate("m => window.voiceDemo.receiveData(m)", json.dumps(t)) is True
    # Malformed, wrongly typed and other-topic messages change nothing.
    for bad in ("{not json", "[1, 2]", json.dumps({"llm_ttft_ms": "fast"}),
                json.dumps({"llm_ttft_ms": -5})):
        assert page.evaluate("m => window.voiceDemo.receiveData(m)", bad) is False
    assert page.evaluate(
        "m => window.voiceDemo.receiveData(m, 'chat')", json.dumps({"llm_ttft_ms": 1})
    ) is False

    def cells(metric: str) -> tuple[str, str]:
        row = page.locator(f'[data-metric="{metric}"]')
        return row.locator(".last").inner_text(), row.locator(".median").inner_text()

    assert cells("eot_to_first_audio_ms") == ("530 ms", "530 ms")  # median of 612, 480, 530
    assert cells("llm_ttft_ms") == ("82 ms", "82 ms")  # median of 95, 70.2, 82
    assert cells("tts_ttfa_ms") == ("150 ms", "165 ms")  # two values: mean of the middle
    expect(page.locator("#latency")).to_have_attribute("data-count", "3")
    expect(page.locator("#latency-empty")).to_be_hidden()
    # each record is a turn of the list, newest first (no transcripts here: LiveKit's
    # come over a real room; the list with words is in test_page_call.py)
    expect(page.locator("#turns li")).to_have_count(3)
    expect(page.locator("#turns li").first.locator(".turn-latency")).to_have_text(
        "530 ms to first audio")
    expect(page.locator("#turns li").last.locator(".turn-latency")).to_have_text(
        "612 ms to first audio")
    shot(page, "page_latency")
