"""The HTTP port's guards on a real server (server/http_guards.py): a page on another
site cannot start syntheses (Origin), an allowed one gets CORS and its preflight, JSON
bodies only, and a connection that dribbles its headers (slowloris) is closed; clients
that send no Origin (SDKs, curl) are not affected."""

from __future__ import annotations

import socket
import time

import aiohttp
import pytest

from .conftest import ServerProc

APP = "https://app.example.com"
BODY = {"model": "tts-1", "input": "Hi.", "voice": "aiden", "response_format": "pcm"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    s = ServerProc(tmp_path_factory.mktemp("guarded"), TTS_CORS_ORIGINS=f"{APP}/",
                   TTS_HEADER_TIMEOUT_S="1")
    yield s
    s.stop()


async def test_origins(guarded: ServerProc) -> None:
    base = f"http://127.0.0.1:{guarded.http_port}"
    speech = f"{base}/v1/audio/speech"
    async with aiohttp.ClientSession() as http:
        async with http.post(speech, json=BODY, headers={"Origin": "http://evil.example"}) as r:
            body = await r.json()
            assert r.status == 403 and body["error"]["code"] == "origin_not_allowed", body
            assert "Access-Control-Allow-Origin" not in r.headers
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await http.ws_connect(f"ws://127.0.0.1:{guarded.http_port}/v1/audio/speech/stream",
                                  headers={"Origin": "http://evil.example"})
        assert e.value.status == 403
        for origin in (base, APP):  # the same host, and TTS_CORS_ORIGINS
            async with http.post(speech, json=BODY, headers={"Origin": origin}) as r:
                assert r.status == 200 and len(await r.read()) > 0
                assert r.headers["Access-Control-Allow-Origin"] == origin
        async with http.options(speech, headers={
                "Origin": APP, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"}) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == APP
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        async with http.post(speech, json=BODY) as r:  # no Origin: an SDK, curl
            assert r.status == 200


async def test_json_bodies_only(guarded: ServerProc) -> None:
    speech = f"http://127.0.0.1:{guarded.http_port}/v1/audio/speech"
    async with aiohttp.ClientSession() as http:
        for ctype in ("text/plain", "application/x-www-form-urlencoded"):
            async with http.post(speech, data=b'{"input": "Hi."}',
                                 headers={"Content-Type": ctype}) as r:
                body = await r.json()
                assert r.status == 415 and body["error"]["code"] == "unsupported_media_type"


def test_slow_headers_are_cut_and_prompt_ones_are_not(guarded: ServerProc) -> None:
    slow = socket.create_connection(("127.0.0.1", guarded.http_port))
    slow.settimeout(5)
    t0 = time.monotonic()
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    try:
        for _ in range(8):  # a header line every 0.3 s, never the blank line
            time.sleep(0.3)
            slow.sendall(b"X-Slow: 1\r\n")
    except OSError:
        pass  # closed under us: what we want
    assert slow.recv(100) == b"" and time.monotonic() - t0 < 4
    slow.close()
    # an idle keep-alive connection that did send a whole request stays usable
    ok = socket.create_connection(("127.0.0.1", guarded.http_port))
    ok.settimeout(5)
    for wait in (0, 1.5):
        time.sleep(wait)
        ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"SERVING" not in answer:
            chunk = ok.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
    ok.close()


def _trickle_until_closed(sock: socket.socket, pieces: list[bytes], every: float) -> float:
    """Sends `pieces` `every` seconds apart until the server closes; -> seconds taken."""
    t0 = time.monotonic()
    try:
        for p in pieces:
            sock.sendall(p)
            time.sleep(every)
            sock.setblocking(False)
            try:
                if sock.recv(1 << 16) == b"":
                    break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
    except OSError:
        pass  # closed under us
    return time.monotonic() - t0


def test_every_request_has_a_header_deadline_and_a_body_its_rate(guarded: ServerProc) -> None:
    # A keep-alive connection: the first request answered, the second's headers trickled.
    conn = socket.create_connection(("127.0.0.1", guarded.http_port))
    conn.settimeout(5)
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"SERVING" not in answer:
        answer += conn.recv(4096)
    took = _trickle_until_closed(
        conn, [b"GET /healthz HTTP/1.1\r\n"] + [b"X-Slow: 1\r\n"] * 20, 0.3)
    assert took < 3, f"a trickled keep-alive request held the socket {took:.1f} s"
    conn.close()
    # A body promised at 100000 bytes and sent a byte at a time.
    conn = socket.create_connection(("127.0.0.1", guarded.http_port))
    conn.settimeout(5)
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: 100000\r\n\r\n")
    took = _trickle_until_closed(conn, [head] + [b" "] * 20, 0.25)
    assert took < 4, f"a trickled body held the socket {took:.1f} s"
    conn.close()


async def test_a_dns_rebinding_page_is_not_same_origin(guarded: ServerProc) -> None:
    # evil.example resolved to 127.0.0.1: its page's Origin and Host agree, and are its own.
    speech = f"http://127.0.0.1:{guarded.http_port}/v1/audio/speech"
    evil = f"evil.example:{guarded.http_port}"
    async with aiohttp.ClientSession() as http:
        async with http.post(speech, json=BODY, headers={"Origin": f"http://{evil}",
                                                         "Host": evil}) as r:
            assert r.status == 403, await r.text()
        # the host's own names still are: loopback names, IP literals, TTS_CORS_ORIGINS'
        for host in (f"localhost:{guarded.http_port}", f"127.0.0.1:{guarded.http_port}",
                     "app.example.com"):
            async with http.post(speech, json=BODY, headers={"Origin": f"https://{host}",
                                                             "Host": host}) as r:
                assert r.status == 200, (host, await r.text())
