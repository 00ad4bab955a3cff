"""`/v1/audio/speech/stream` from a real browser: headless Debian chromium (playwright)
opens the WebSocket of a real server, streams a sentence in pieces and reads the frames
as ArrayBuffers, as a web page would. Nothing is played: the page returns what it got
(the message order, frame sizes, the PCM as base64, the close code) and the test checks
it against the contract and against the gRPC path's bytes for the same input.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from voice_tts.client import synthesize

from .conftest import ServerProc, config

CHROMIUM = "/usr/bin/chromium"
# As services/token/tests/test_page.py: without the background-networking flags chromium
# floods this machine's closed network.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
FRAME_BYTES = 24000 * 20 // 1000 * 2  # 20 ms of s16le at 24 kHz
SEED, MAX_FRAMES = 1234, 12  # 12 codec frames of 80 ms = 48 frames of 20 ms
# Word by word, one word split mid-word; the ("bytes", ...) piece goes as a binary
# message (raw UTF-8), the rest as {"type": "text"}.
PIECES = [("text", "Hello "), ("text", "brow"), ("text", "ser "), ("bytes", "café "),
          ("text", "world.")]

# A client over one socket: `log` is every message in arrival order ("A" for a binary
# frame, else the event's type); `until(pred)` waits for the log to satisfy `pred`.
SOCKET_JS = """() => {
window.openSpeechSocket = (url) => new Promise((resolve, reject) => {
  const ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  const s = {ws, log: [], frames: [], events: [], closeCode: null, waiters: []};
  const notify = () => { s.waiters = s.waiters.filter((check) => !check()); };
  s.closed = new Promise((done) => {
    ws.onclose = (e) => { s.closeCode = e.code; notify(); done(e.code); };
  });
  ws.onmessage = (m) => {
    if (m.data instanceof ArrayBuffer) {
      s.frames.push(new Uint8Array(m.data));
      s.log.push('A');
    } else {
      const event = JSON.parse(m.data);
      s.events.push(event);
      s.log.push(event.type);
    }
    notify();
  };
  s.json = (obj) => ws.send(JSON.stringify(obj));
  s.until = (pred, ms = 30000) => new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(
      'timed out; got ' + s.log.join(' ') + ' close ' + s.closeCode)), ms);
    const check = () => { if (!pred()) return false; clearTimeout(timer); ok(); return true; };
    if (!check()) s.waiters.push(check);
  });
  s.summary = () => {
    const all = new Uint8Array(s.frames.reduce((n, f) => n + f.length, 0));
    let at = 0;
    for (const f of s.frames) { all.set(f, at); at += f.length; }
    let bin = '';
    for (let i = 0; i < all.length; i += 0x8000) {
      bin += String.fromCharCode(...all.subarray(i, i + 0x8000));
    }
    return {log: s.log, events: s.events, lengths: s.frames.map((f) => f.length),
            pcm: btoa(bin), closeCode: s.closeCode};
  };
  ws.onopen = () => resolve(s);
  ws.onerror = () => reject(new Error('websocket error before open'));
});
}
"""

# The sentence in pieces, then `end`: the server closes after the last frame.
STREAM_SENTENCE_JS = """
async ({url, config, pieces}) => {
  const s = await openSpeechSocket(url);
  s.json({type: 'config', ...config});
  for (const [kind, text] of pieces) {
    if (kind === 'bytes') s.ws.send(new TextEncoder().encode(text));
    else s.json({type: 'text', text});
  }
  s.json({type: 'end'});
  await s.until(() => s.closeCode !== null);
  return s.summary();
}
"""

# Speak, stop a few frames in, listen 300 ms, then speak again on the same socket.
STOP_THEN_SPEAK_JS = """
async ({url, config, text}) => {
  const s = await openSpeechSocket(url);
  s.json({type: 'config', ...config});
  s.json({type: 'text', text});
  s.json({type: 'flush'});
  await s.until(() => s.log.includes('first_audio') && s.frames.length >= 3);
  s.json({type: 'stop'});
  await s.until(() => s.log.includes('stopped'));
  await new Promise((done) => setTimeout(done, 300));
  const quiet = s.log.slice(s.log.indexOf('stopped') + 1);
  s.json({type: 'text', text: 'Again.'});
  s.json({type: 'end'});
  await s.until(() => s.closeCode !== null);
  return {...s.summary(), quiet};
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run services/token/setup.sh (apt chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, server: ServerProc) -> Iterator[Page]:
    ctx = browser.new_context()
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # Same origin as the socket, as a page the server (or its proxy) served would be.
    pg.goto(f"http://127.0.0.1:{server.http_port}/healthz")
    pg.evaluate(SOCKET_JS)
    yield pg
    ctx.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def ws_url(server: ServerProc) -> str:
    return f"ws://127.0.0.1:{server.http_port}/v1/audio/speech/stream"


def ws_config(max_frames: int) -> dict[str, Any]:
    return {"voice": "vivian", "seed": SEED,
            "sampling": {"greedy": True, "max_frames": max_frames}}


def grpc_pcm(addr: str, pieces: list[str]) -> bytes:
    """The same utterance over gRPC (`synthesize`), in a thread: playwright's sync API
    owns this thread's event loop."""
    async def run() -> bytes:
        async with grpc.aio.insecure_channel(addr) as ch:
            cfg = config(seed=SEED)
            cfg.sampling.max_frames = MAX_FRAMES
            return (await synthesize(ch, pieces, cfg)).pcm

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result(timeout=120)


def test_browser_streams_a_sentence_and_gets_the_grpc_bytes(page: Page,
                                                            server: ServerProc) -> None:
    got = page.evaluate(STREAM_SENTENCE_JS, {"url": ws_url(server),
                                             "config": ws_config(MAX_FRAMES),
                                             "pieces": PIECES})
    log, events = got["log"], got["events"]
    assert got["closeCode"] == 1000, got
    # started -> first_audio -> the frames (random weights rarely reach EOS: the cap
    # ends it, `truncated`) -> flushed, the last message.
    assert log[:2] == ["started", "first_audio"], log
    assert log[-1] == "flushed" and set(log[2:-1]) <= {"A", "truncated"}, log
    started, first, flushed = events[0], events[1], events[-1]
    assert started["config"]["frame_ms"] == 20 and started["config"]["seed"] == SEED
    assert first["timings"]["ttfa_ms"] > 0 and first["next_seq"] == 0
    assert got["lengths"] and set(got["lengths"]) == {FRAME_BYTES}
    assert len(got["lengths"]) == flushed["next_seq"] == MAX_FRAMES * 4
    pcm = base64.b64decode(got["pcm"])
    assert len(pcm) == sum(got["lengths"]) and pcm.strip(b"\0"), "no PCM, or silence"
    want = grpc_pcm(server.addr, [text for _, text in PIECES])
    assert pcm == want, f"{len(pcm)} bytes over the WebSocket, {len(want)} over gRPC"


def test_browser_stop_silences_then_the_socket_speaks_again(page: Page,
                                                             server: ServerProc) -> None:
    # 60 codec frames = 4.8 s: paced near real time after a 1 s lead, still speaking
    # when the stop lands.
    got = page.evaluate(STOP_THEN_SPEAK_JS, {
        "url": ws_url(server), "config": ws_config(60),
        "text": "Hello there, streaming world. " * 3})
    log, events = got["log"], got["events"]
    assert got["closeCode"] == 1000, got
    assert "A" not in got["quiet"], f"a frame arrived after stopped: {got['quiet']}"
    at_stop = log.index("stopped")
    old_frames = log[:at_stop].count("A")
    stopped = next(e for e in events if e["type"] == "stopped")
    assert stopped["utterance_id"] == 0 and stopped["next_seq"] == old_frames
    assert 3 <= old_frames < 60 * 4, "stop must cut the utterance short"
    # Nothing of utterance 0 after `stopped`: the next audio is utterance 1's.
    after = log[at_stop + 1:]
    assert after.index("first_audio") < after.index("A"), after
    second = [e for e in events if e["type"] == "first_audio"][-1]
    assert second["utterance_id"] == 1 and second["next_seq"] == old_frames
    assert log[-1] == "flushed" and events[-1]["next_seq"] == log.count("A")
    assert set(got["lengths"]) == {FRAME_BYTES}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("keyed-browser"), TTS_API_KEYS="browser-key-0123")
    yield s
    s.stop()


def test_a_browser_shows_its_key_in_the_url_and_other_sites_are_refused(
        browser: Browser, keyed: ServerProc, server: ServerProc) -> None:
    """Keys on: the page opens the socket with `?api_key=` (a browser cannot set its
    headers) and speaks; without it, or from a page on another origin (the other
    server's port), the browser's socket never opens."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    try:
        pg.goto(f"http://127.0.0.1:{keyed.http_port}/healthz")
        pg.evaluate(SOCKET_JS)
        got = pg.evaluate(STREAM_SENTENCE_JS, {"url": ws_url(keyed) + "?api_key=browser-key-0123",
                                               "config": ws_config(4), "pieces": PIECES})
        assert got["closeCode"] == 1000 and got["lengths"], got
        opened = "(url) => openSpeechSocket(url).then(() => 'open', (e) => e.message)"
        assert pg.evaluate(opened, ws_url(keyed)) == "websocket error before open"
        assert pg.evaluate(opened, ws_url(keyed) + "?api_key=nope") != "open"
        pg.goto(f"http://127.0.0.1:{server.http_port}/healthz")  # another origin
        pg.evaluate(SOCKET_JS)
        assert pg.evaluate(opened, ws_url(keyed) + "?api_key=browser-key-0123") != "open"
        assert pg.evaluate(opened, ws_url(server)) == "open"  # its own origin still may
    finally:
        ctx.close()
