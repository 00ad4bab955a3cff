"""The web page converses with the agent in the local mesh, no LiveKit: headless Chromium
(Debian's, driven by playwright) with a fake microphone that plays real espeak-ng speech,
the page served by the real token service, the real agent (`serve-direct`, its WebSocket
/v1/talk) with the real tiny TTS and tiny thinker, all started by deploy/local/mesh.py.

The greeting is on, as shipped, and this is the fresh agent's first call (it used to end
with "too_fast" while the agent made its greeting). The page must hear the greeting, then a
reply (audible PCM received), show the user's transcript and the turn's latency, and never
leave the call. The tiny thinker is text-only: the agent hears through its default
fallback, PocketSphinx (real recognition, offline), so the transcript is words, never the
"[untranscribed speech]" test marker. Screenshot: artifacts/mesh/page_websocket_conversation.png.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import wave
from pathlib import Path
from typing import Any

import pytest
from test_mesh import ROOT
from voice_testkit import MeshDidNotStart, stop_mesh
from voice_testkit import start_mesh as launch_mesh

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts" / "mesh"

pytestmark = pytest.mark.skipif(
    not all((ROOT / ".venv" / v / "bin/python").exists() for v in ("tts", "llm", "token", "agent")),
    reason="service venvs missing (make venvs)")


def mic_wav(tmp: Path) -> Path:
    """espeak-ng speech between silences: 7 s (the greeting, ~6 s, plays out), speech, 60 s
    (chromium loops the file: the question is not asked again, and so does not cut off
    the reply, before the test has seen the answer)."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng missing: run services/agent/setup.sh")
    raw = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en", "-w", str(raw), "What is the weather like today?"],
                   check=True)
    with wave.open(str(raw)) as w:
        rate, speech = w.getframerate(), w.readframes(w.getnframes())
    pcm = bytes(2 * rate * 7) + speech + bytes(2 * rate * 60)  # s16 silence around it
    out = tmp / "mic.wav"
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out


def fake_mic_chromium(pw, wav: Path):
    """Headless Debian chromium whose microphone plays `wav`, mic permission granted."""
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--autoplay-policy=no-user-gesture-required"])


def start_mesh(tmp: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    try:
        return launch_mesh(ROOT, tmp / "run", {
            # a short reply from the random models (as the agent's own session tests); the
            # greeting and the TTS as shipped (no frame cap: the phrases take seconds to make)
            "AGENT_LLM_MAX_TOKENS": "24",
            "AGENT_LLM_TEMPERATURE": "1.0", "AGENT_LLM_SEED": "3", "AGENT_TTS_VOICE": "aiden",
        })
    except MeshDidNotStart as e:
        pytest.fail(str(e))


def page_conversation(wav: Path, url: str, shot: Path, ws_url: str | None = None) -> dict:
    """One call through the page at `url` in chromium whose microphone plays `wav`: Join,
    hear the greeting, say the words, wait for the transcript, the latency record and the
    reply's audio, screenshot to `shot`, Leave. What the page showed, for the asserts."""
    with playwright.sync_playwright() as pw:
        browser = fake_mic_chromium(pw, wav)
        page = browser.new_page(viewport={"width": 1000, "height": 820})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        expect = playwright.expect
        expect(page.locator("body")).to_have_attribute("data-transport", "websocket")
        if ws_url:
            expect(page.locator("#transport")).to_contain_text(ws_url)
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening",
                                                         timeout=20_000)
        audible = "() => window.voiceDemo.socket.stats.audible"
        deadline = time.monotonic() + 10  # the greeting, from the agent's phrase cache
        while page.evaluate(audible) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        greeting_frames = page.evaluate(audible)
        # the user's turn: transcript, then the reply's latency record and its audio
        expect(page.locator("#user-text")).not_to_have_text("–", timeout=60_000)
        eot = page.locator('[data-metric="eot_to_first_audio_ms"] .last')
        expect(eot).to_have_text(re.compile(r"^\d+ ms$"), timeout=60_000)
        deadline = time.monotonic() + 30  # (wait_for_function would eval: CSP says no)
        while page.evaluate(audible) < greeting_frames + 25 and time.monotonic() < deadline:
            time.sleep(0.1)
        t_answer = time.monotonic()
        wait_for_answer(page)
        print(f"answer shown after {time.monotonic() - t_answer:.1f} s")
        talk = {"stats": page.evaluate("window.voiceDemo.socket.stats"),
                "state": page.locator("#state").get_attribute("data-state"),
                "user_text": page.locator("#user-text").inner_text(),
                "eot": eot.inner_text(), "greeting_frames": greeting_frames,
                "errors": errors}
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        page.click("#leave")
        expect(page.locator("#state")).to_have_attribute("data-state", "idle")
        browser.close()
    print(f"\npage: user said {talk['user_text']!r}, EoT->first audio {talk['eot']}, "
          f"received {talk['stats']}")
    return talk


def wait_for_answer(page: Any, quiet_s: float = 20.0, most_s: float = 240.0) -> None:
    """The answer's text shows once the reply has been spoken: random weights babble to the
    thinker's token cap (~30 s of audio), and a busy CI host speaks it slower still. So wait
    while the reply's audio keeps coming; fail when it stopped `quiet_s` ago with no text."""
    frames = "() => window.voiceDemo.socket.stats.frames"
    answer = page.locator("#agent-text")
    t0 = last_change = time.monotonic()
    last = page.evaluate(frames)
    while answer.inner_text() == "–":
        now, n = time.monotonic(), page.evaluate(frames)
        if n != last:
            last, last_change = n, now
        assert now - last_change < quiet_s, \
            f"the reply's audio stopped {quiet_s:.0f} s ago ({n} frames) and no answer shows"
        assert now - t0 < most_s, f"no answer shown after {most_s:.0f} s of reply audio"
        time.sleep(0.2)


def assert_conversation(talk: dict) -> None:
    stats, greeting_frames = talk["stats"], talk["greeting_frames"]
    user_text = talk["user_text"]
    assert re.search(r"[a-z]", user_text) and "untranscribed" not in user_text  # words heard
    assert stats["sent"] > 100, stats  # the mic streamed
    assert greeting_frames >= 10, stats  # the greeting was heard
    assert stats["peak"] > 1000 and stats["audible"] >= greeting_frames + 25, stats  # a reply
    assert talk["state"] in ("listening", "thinking", "speaking"), talk  # still in the call
    assert talk["errors"] == [], talk["errors"]


def test_page_talks_to_the_agent_over_its_websocket(tmp_path: Path) -> None:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run services/token/setup.sh (apt chromium)")
    subprocess.run(["bash", str(ROOT / "services/token/web/build.sh")], check=True)
    wav = mic_wav(tmp_path)
    proc, env = start_mesh(tmp_path)
    shot = ARTIFACTS / "page_websocket_conversation.png"
    try:
        talk = page_conversation(wav, f"http://127.0.0.1:{env['TOKEN_HTTP_PORT']}/", shot,
                                 f"ws://127.0.0.1:{env['AGENT_HTTP_PORT']}/v1/talk")
    finally:
        stop_mesh(proc)
    assert_conversation(talk)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
