"""The page in a call over the agent's WebSocket (LIVEKIT_URL empty), in headless chromium.

No agent runs here (named boundary): `fake_agent` is a WebSocket endpoint on localhost
that speaks the agent's /v1/talk protocol only as far as each test scripts it. Silent, it
is an agent that accepted the call and never answers (stuck before "ready", or another
service on its port): the page must say "No agent answered" and what to check, and give
way to an agent that answers late. Scripted, it sends the events a real agent sends in a
conversation, through the page's real transport code (AgentSocket, talk.js): the page
lists each turn, what was heard, the answer and the turn's latency. The real agent is
tests/mesh/test_mesh_page.py. Screenshots go to artifacts/token/.

The feedback buttons' test runs the real agent (`serve-direct`, from the agent's venv)
with its folder on, its TTS and thinker absent (named boundary: the reply is not what it
is about; the agent stays silent as in a backend outage), and a fake microphone that
speaks espeak-ng: the agent hears and decides a real turn, and the click saves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web
from conftest import CHROMIUM, FLAGS, REPO, shot
from playwright.sync_api import Browser, Page, expect
from voice_testkit import free_port, stop_process

READY = {"type": "ready", "protocol": 1, "session_id": "fake", "input_rate": 48000,
         "output_rate": 24000, "frame_ms": 20, "encoding": "s16le"}


class FakeAgent:
    """FAKE (named boundary): the agent's /v1/talk, answering only what the test scripts."""

    def __init__(self, on_start: list[dict], voices: dict | None = None) -> None:
        self.on_start = on_start  # events sent when the page's "start" arrives
        self.voices = voices  # GET /v1/voices's body (None: no such route, an older agent)
        self.started: list[dict] = []  # the page's start messages
        self.mic_bytes = 0
        self.sockets: list[web.WebSocketResponse] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.url = ""

    async def talk(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                self.mic_bytes += len(msg.data)
            elif msg.type == WSMsgType.TEXT and json.loads(msg.data).get("type") == "start":
                self.started.append(json.loads(msg.data))
                for event in self.on_start:
                    await ws.send_str(json.dumps(event))
        return ws

    async def list_voices(self, request: web.Request) -> web.Response:
        # the page is on the token service's port: a cross-origin fetch, as the agent allows
        return web.json_response(self.voices, headers={
            "Access-Control-Allow-Origin": request.headers.get("Origin", "*")})

    def send(self, *events: dict) -> None:
        """Send events to every open call, now (from the test's thread)."""
        async def go() -> None:
            for ws in self.sockets:
                for event in events:
                    await ws.send_str(json.dumps(event))

        asyncio.run_coroutine_threadsafe(go(), self.loop).result(5)


@contextlib.contextmanager
def fake_agent(on_start: list[dict] | None = None,
               voices: dict | None = None) -> Iterator[FakeAgent]:
    agent = FakeAgent(on_start or [], voices)
    app = web.Application()
    app.router.add_get("/v1/talk", agent.talk)
    if voices is not None:
        app.router.add_get("/v1/voices", agent.list_voices)
    runner = web.AppRunner(app)
    # its own loop in its own thread: playwright's sync API holds this thread's loop
    thread = threading.Thread(target=agent.loop.run_forever, daemon=True)
    thread.start()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()

    async def stop() -> None:
        for ws in agent.sockets:
            await ws.close()
        await runner.cleanup()

    try:
        asyncio.run_coroutine_threadsafe(start(), agent.loop).result(10)
        agent.port = runner.addresses[0][1]
        agent.url = f"ws://127.0.0.1:{agent.port}/v1/talk"
        yield agent
    finally:
        asyncio.run_coroutine_threadsafe(stop(), agent.loop).result(10)
        agent.loop.call_soon_threadsafe(agent.loop.stop)
        thread.join(5)
        agent.loop.close()


def test_page_says_when_no_agent_answers(server_factory, page: Page) -> None:  # type: ignore[no-untyped-def]
    with fake_agent() as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url,
                             TOKEN_AGENT_TIMEOUT_SECONDS="1")
        page.goto(srv.url + "/")
        expect(page.locator("body")).to_have_attribute("data-agent-timeout-ms", "1000")
        expect(page.locator("#voice-label")).to_be_hidden()  # no voices to pick from
        page.click("#join")
        # connected, the agent has not said "ready": waiting, then after 1 s, no agent
        expect(page.locator("#state")).to_have_attribute("data-state", "waiting")
        expect(page.locator("#state-label")).to_have_text("Waiting for the agent…")
        expect(page.locator("#state")).to_have_attribute("data-state", "no-agent",
                                                         timeout=5_000)
        expect(page.locator("#state-label")).to_have_text("No agent answered")
        detail = page.locator("#state-detail")
        expect(detail).to_contain_text(f"{agent.url} accepted the call, but no agent "
                                       "answered within 1 s")
        expect(detail).to_contain_text("make up starts it")
        expect(detail).to_contain_text(f"http://127.0.0.1:{agent.port}/healthz")
        expect(page.locator("#leave")).to_be_enabled()  # still in the call
        expect(page.locator("#join")).to_be_disabled()
        shot(page, "page_no_agent")
        assert agent.started and agent.started[0]["type"] == "start"
        # an agent that answers late takes over
        agent.send(READY, {"type": "state", "state": "listening"})
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        page.click("#leave")
        expect(page.locator("#state")).to_have_attribute("data-state", "idle")


def test_page_lists_each_turn_what_was_heard_and_its_latency(server_factory, page: Page) -> None:  # type: ignore[no-untyped-def]
    greeting = [
        READY, {"type": "state", "state": "speaking"},
        {"type": "latency", "trace_id": "g1", "eot_to_first_audio_ms": None,
         "llm_ttft_ms": None, "tts_ttfa_ms": 95.0},
        {"type": "transcript", "role": "assistant", "text": "Hello! How can I help?",
         "interrupted": False},
        {"type": "state", "state": "listening"},
    ]
    with fake_agent(on_start=greeting) as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
        page.goto(srv.url + "/")
        expect(page.locator("#turns-empty")).to_be_visible()
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        expect(page.locator("#turns li")).to_have_count(1)
        # two user turns, as the agent sends them: words heard, latency, the answer
        for heard, ms, answer, cut in (
            ("what is the weather like today", 512.3, "Sunny and warm.", False),
            ("<b>and tomorrow?</b>", 431.0, "Rain, I", True),
        ):
            agent.send(
                {"type": "state", "state": "thinking"},
                {"type": "transcript", "role": "user", "text": heard, "interrupted": False},
                {"type": "latency", "trace_id": "t", "eot_to_first_audio_ms": ms,
                 "llm_ttft_ms": 80.0, "tts_ttfa_ms": 120.0},
                {"type": "state", "state": "speaking"},
                {"type": "transcript", "role": "assistant", "text": answer, "interrupted": cut},
                {"type": "state", "state": "listening"},
            )
        items = page.locator("#turns li")
        expect(items).to_have_count(3)
        newest, middle, first = items.nth(0), items.nth(1), items.nth(2)
        expect(newest).to_have_attribute("data-turn", "3")
        # transcripts are text, never markup
        expect(newest.locator(".turn-user .text")).to_have_text("<b>and tomorrow?</b>")
        assert newest.locator("b").count() == 0
        expect(newest.locator(".turn-agent .text")).to_have_text("Rain, I …(interrupted)")
        expect(newest.locator(".turn-latency")).to_have_text("431 ms to first audio")
        expect(middle.locator(".turn-user .text")).to_have_text("what is the weather like today")
        expect(middle.locator(".turn-agent .text")).to_have_text("Sunny and warm.")
        expect(middle.locator(".turn-latency")).to_have_text("512 ms to first audio")
        # the greeting: the agent spoke first, no end of turn to measure from
        expect(first.locator(".turn-agent .text")).to_have_text("Hello! How can I help?")
        assert first.locator(".turn-user").count() == 0
        expect(first.locator(".turn-latency")).to_have_text("")
        expect(page.locator("#turns-empty")).to_be_hidden()
        # the latest lines and the last/median table still show
        expect(page.locator("#user-text")).to_have_text("<b>and tomorrow?</b>")
        eot = page.locator('[data-metric="eot_to_first_audio_ms"]')
        expect(eot.locator(".last")).to_have_text("431 ms")
        expect(eot.locator(".median")).to_have_text("472 ms")
        shot(page, "page_turns")
        assert agent.mic_bytes > 0  # the fake microphone streamed meanwhile
        page.click("#leave")


def test_page_says_how_to_fix_a_blocked_microphone(server_factory, browser: Browser) -> None:  # type: ignore[no-untyped-def]
    # A browser of its own without the flag that grants the microphone: headless chromium
    # then refuses it, as a person pressing "Block" does.
    blocking = browser.browser_type.launch(
        executable_path=CHROMIUM, headless=True,
        args=[f for f in FLAGS if f != "--use-fake-ui-for-media-stream"])
    try:
        with fake_agent(on_start=[READY, {"type": "state", "state": "listening"}]) as agent:
            srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
            page = blocking.new_page(viewport={"width": 1000, "height": 720})
            page.goto(srv.url + "/")
            expect(page.locator("#notice")).to_be_hidden()
            page.click("#join")
            # the call goes on (the agent can still be heard); the notice says how to fix it
            expect(page.locator("#state")).to_have_attribute("data-state", "listening")
            notice = page.locator("#notice")
            expect(notice).to_be_visible()
            expect(notice).to_contain_text("The microphone is blocked for this page")
            expect(notice).to_contain_text("Allow it")
            expect(notice).to_contain_text("then press Leave and Join again")
            expect(notice).to_contain_text("the agent cannot hear you")
            shot(page, "page_microphone_blocked")
            assert agent.mic_bytes == 0
            page.click("#leave")
    finally:
        blocking.close()


def test_page_picks_the_agents_voice_for_the_call(server_factory, page: Page) -> None:  # type: ignore[no-untyped-def]
    voices = {"default": "serena", "default_found": True, "voices": [
        {"name": "serena", "kind": "preset", "languages": ["chinese"]},
        {"name": "alice", "kind": "clone", "languages": []},
    ]}
    with fake_agent(on_start=[READY, {"type": "state", "state": "listening"}],
                    voices=voices) as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
        page.goto(srv.url + "/")
        select = page.locator("#voice")
        expect(page.locator("#voice-label")).to_be_visible()
        expect(select).to_have_value("serena")  # the agent's own voice first
        expect(select.locator("option")).to_have_text(["serena", "alice (clone)"])
        select.select_option("alice")
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        expect(select).to_be_disabled()  # the call keeps the voice it started with
        shot(page, "page_voice")
        assert agent.started[0]["voice"] == "alice"
        page.click("#leave")
        expect(select).to_be_enabled()
        select.select_option("serena")
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        assert [m.get("voice") for m in agent.started] == ["alice", "serena"]
        page.click("#leave")


# what a thinker with random weights answers: bytes that are no UTF-8 (U+FFFD once
# decoded), control characters, and long runs without a space
BABBLE = ("\ufffd\x01ab\x7f\ufffd\u200b" * 12) + "x" * 240 + "\ttab\r\n end"


def test_page_pairs_each_answer_with_its_question_and_lays_out_babble(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    """Issue 51, item 14: "Conversation (latest)" shows one turn's question and answer
    (a new question never stands next to the previous answer); babble reads as demo-chat
    prints it (· for replacement and control characters); a long list of long turns stays
    inside the card and its scrolled box ends above the Latency heading."""
    with fake_agent(on_start=[READY, {"type": "state", "state": "listening"}]) as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
        page.goto(srv.url + "/")
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        user, answer = page.locator("#user-text"), page.locator("#agent-text")
        agent.send({"type": "transcript", "role": "user", "text": "what is the weather"},
                   {"type": "transcript", "role": "assistant", "text": "Sunny."})
        expect(answer).to_have_text("Sunny.")
        expect(user).to_have_text("what is the weather")
        # the next question: its answer is not "Sunny."
        agent.send({"type": "transcript", "role": "user", "text": "and tomorrow?"})
        expect(user).to_have_text("and tomorrow?")
        expect(answer).to_have_text("–")
        expect(page.locator("#babble-note")).to_be_hidden()
        agent.send({"type": "transcript", "role": "assistant", "text": BABBLE})
        shown = "··ab···" * 12 + "x" * 240 + "·tab·\n end"
        expect(answer).to_have_text(shown)
        expect(user).to_have_text("and tomorrow?")
        newest = page.locator("#turns li").first
        expect(newest.locator(".turn-agent .text")).to_have_text(shown)
        expect(newest.locator(".turn-agent .text")).to_have_attribute(
            "title", "· = bytes that are no text: random weights babble")
        expect(page.locator("#babble-note")).to_be_visible()
        assert "\ufffd" not in page.locator("#transcript").inner_text()
        # many turns of babble: the list scrolls in its own box
        for i in range(12):
            agent.send({"type": "transcript", "role": "user", "text": f"question {i}"},
                       {"type": "latency", "trace_id": "t", "eot_to_first_audio_ms": 400 + i,
                        "llm_ttft_ms": 80.0, "tts_ttfa_ms": 120.0},
                       {"type": "transcript", "role": "assistant", "text": BABBLE})
        expect(page.locator("#turns li").first.locator(".turn-user .text")).to_have_text(
            "question 11")
        expect(user).to_have_text("question 11")
        turns = page.locator("#turns").bounding_box()
        heading = page.locator("#latency h2").bounding_box()
        card = page.locator("main.card").bounding_box()
        assert turns and heading and card
        gap = heading["y"] - (turns["y"] + turns["height"])
        assert gap >= 12, f"the Turns list ends {gap:.1f} px from the Latency heading"
        # nothing wider than the card: no text runs out of it, no sideways scrolling
        assert page.evaluate("document.documentElement.scrollWidth") <= 1000
        right = card["x"] + card["width"]
        for sel in ("#user-text", "#agent-text", "#turns .text"):
            for box in (el.bounding_box() for el in page.locator(sel).all()):
                assert box and box["x"] + box["width"] <= right, (sel, box, right)
        page.set_viewport_size({"width": 1000, "height": int(card["height"]) + 80})
        shot(page, "page_babble_layout")
        page.click("#leave")


def test_page_shows_the_reply_as_captions_while_it_is_spoken(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    """Issue 62, item 9: the agent's `caption` deltas (sent as the reply's audio plays)
    build the answer line word by word; the reply's transcript then replaces them (what
    a barge-in kept), and the next question starts an empty answer."""
    with fake_agent(on_start=[READY, {"type": "state", "state": "listening"}]) as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
        page.goto(srv.url + "/")
        page.click("#join")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        answer = page.locator("#agent-text")
        agent.send({"type": "transcript", "role": "user", "text": "tell me a story"},
                   {"type": "caption", "delta": "Once upon"})
        expect(answer).to_have_text("Once upon")
        expect(answer).to_have_attribute("data-live", "true")
        agent.send({"type": "caption", "delta": " a time"})
        expect(answer).to_have_text("Once upon a time")
        agent.send({"type": "transcript", "role": "assistant", "text": "Once upon a time",
                    "interrupted": True})
        expect(answer).not_to_have_attribute("data-live", "true")
        agent.send({"type": "transcript", "role": "user", "text": "go on"})
        expect(answer).to_have_text("–")
        shot(page, "captions")


def test_page_shows_the_feedback_buttons_only_when_the_agent_takes_feedback(
    server_factory, page: Page  # type: ignore[no-untyped-def]
) -> None:
    """No buttons when the agent's `ready` says no feedback (or, an older agent, nothing);
    with it, a refusal (a kept error) shows next to the buttons and the call goes on."""
    for ready in ({**READY, "feedback": False}, READY):
        with fake_agent(on_start=[ready, {"type": "state", "state": "listening"}]) as agent:
            srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
            page.goto(srv.url + "/")
            page.click("#join")
            expect(page.locator("#state")).to_have_attribute("data-state", "listening")
            expect(page.locator("#feedback")).to_be_hidden()
            page.click("#leave")
    with fake_agent(on_start=[{**READY, "feedback": True},
                              {"type": "state", "state": "listening"}]) as agent:
        srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=agent.url)
        page.goto(srv.url + "/")
        expect(page.locator("#feedback")).to_be_hidden()  # no call yet
        page.click("#join")
        expect(page.locator("#feedback")).to_be_visible()
        agent.send({"type": "error", "code": "feedback_no_turn",
                    "message": "no turn to give feedback on"})
        expect(page.locator("#feedback-note")).to_have_text(
            "Not saved: no turn to give feedback on")
        expect(page.locator("#state")).to_have_attribute("data-state", "listening")
        page.click("#leave")
        expect(page.locator("#feedback")).to_be_hidden()


AGENT_PYTHON = REPO / ".venv" / "agent" / "bin" / "python"


@contextlib.contextmanager
def real_agent(tmp: Path, **env: str) -> Iterator[str]:
    """The agent's `serve-direct` on a free port, its TTS and thinker down, the offline
    ear; yields its /v1/talk URL once its HTTP side answers."""
    if not AGENT_PYTHON.exists():
        pytest.fail(f"{AGENT_PYTHON} missing: build it with `make venvs`")
    port, down = free_port(), free_port()  # nothing listens on `down`
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    full_env.update({
        "AGENT_HTTP_HOST": "127.0.0.1", "AGENT_HTTP_PORT": str(port),
        "AGENT_TTS_ADDR": f"127.0.0.1:{down}", "AGENT_THINKER_ADDR": f"127.0.0.1:{down}",
        "AGENT_STT_BACKEND": "offline", "AGENT_STT_WORKERS": "1", "AGENT_GREETING": "",
        "AGENT_ADMIT_MAX_LAG_MS": "0", **env})
    log_path = tmp / f"agent-{port}.log"
    with open(log_path, "wb") as log:  # the child keeps its own copy of the fd
        proc = subprocess.Popen([str(AGENT_PYTHON), "-m", "voice_agent", "serve-direct"],
                                env=full_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the agent exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no agent in 60 s:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read()
                break
            time.sleep(0.2)
        yield f"ws://127.0.0.1:{port}/v1/talk"
    finally:
        stop_process(proc, 15)


def speech_wav(tmp: Path, text: str) -> Path:
    """espeak-ng's `text` after 1 s of silence, then 40 s of silence (chromium loops the
    file: the question is not asked again before the test is done)."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng missing: run services/agent/setup.sh")
    raw = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en", "-w", str(raw), text], check=True)
    with wave.open(str(raw)) as w:
        rate, speech = w.getframerate(), w.readframes(w.getnframes())
    out = tmp / "mic.wav"
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * rate) + speech + bytes(2 * rate * 40))
    return out


def test_page_feedback_saves_the_turn_on_the_agent(server_factory, browser: Browser,  # type: ignore[no-untyped-def]
                                                   tmp_path: Path) -> None:
    """The feedback recorder end to end: a call through the page with a fake microphone
    that asks a question, the real agent hears the turn; "You cut me off" makes the agent
    save it (a wav and a json in AGENT_FEEDBACK_DIR) and the page says so."""
    folder = tmp_path / "feedback"
    wav = speech_wav(tmp_path, "What is the weather like today?")
    mic = browser.browser_type.launch(  # a browser whose microphone speaks `wav`
        executable_path=CHROMIUM, headless=True,
        args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"])
    try:
        with real_agent(tmp_path, AGENT_FEEDBACK_DIR=str(folder)) as url:
            srv = server_factory(LIVEKIT_URL="", TOKEN_AGENT_WS_URL=url)
            page = mic.new_page(viewport={"width": 1000, "height": 820})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.url + "/")
            page.click("#join")
            expect(page.locator("#state")).to_have_attribute("data-state", "listening",
                                                             timeout=20_000)
            buttons = page.locator("#feedback")
            expect(buttons).to_be_visible()
            expect(page.locator("#user-text")).not_to_have_text("–", timeout=60_000)
            heard = page.locator("#user-text").inner_text()
            page.click("#cut-off")
            note = page.locator("#feedback-note")
            expect(note).to_have_text("Saved “You cut me off”. Thank you!", timeout=10_000)
            pair = note.get_attribute("title")
            shot(page, "page_feedback")
            page.click("#leave")
            expect(buttons).to_be_hidden()
            assert errors == [], errors
    finally:
        mic.close()
    assert sorted(p.name for p in folder.iterdir()) == [f"{pair}.json", f"{pair}.wav"]
    meta = json.loads((folder / f"{pair}.json").read_text())
    assert meta["label"] == "unfinished" and meta["source"] == "feedback"
    assert meta["text"] == heard and meta["decision"]["detector"] == "text"
    with wave.open(str(folder / f"{pair}.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        pcm = w.readframes(w.getnframes())
        seconds = w.getnframes() / 16000
    peak = max(abs(int.from_bytes(pcm[i:i + 2], "little", signed=True))
               for i in range(0, len(pcm), 2))
    assert seconds > 1.0 and peak > 1000, (seconds, peak)  # the question, as the agent heard it
