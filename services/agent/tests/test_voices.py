"""The agent speaking in a voice of the TTS's voice library: AGENT_TTS_VOICE set to a
library voice, and one conversation's own voice (`{"type": "start", "voice": ...}` on
/v1/talk, the list from GET /v1/voices), against a real TTS server on a localhost port.

The TTS is the tiny random Base checkpoint (`preset:tiny-base`) with a voice library
(TTS_VOICE_DIR): "alice" is made over its HTTP API (`POST /v1/audio/voices`, a WAV
stand-in for speech) as a user would make it. The conversations here only greet (no
thinker runs: AGENT_THINKER_ADDR is a closed port, which no greeting touches), so what
is asserted is the voice: its audio arrives, in the asked voice, and an unknown voice is
refused at the start with its name and the TTS's voices.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import wave
from collections.abc import AsyncIterator, Iterator

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from voice_agent import talk
from voice_agent.http import make_app
from voice_agent.settings import AgentSettings
from voice_testkit import free_port

from .backends import Server

GREETING = "Hello there."


def reference_wav(seconds: float = 4.0, rate: int = 16000) -> bytes:
    """Speech stand-in for a clone: a few harmonics and noise (not silent, not clipped)."""
    t = np.arange(int(seconds * rate)) / rate
    x = sum(np.sin(2 * np.pi * f * t) / (i + 1) for i, f in enumerate((180, 360, 540)))
    x = 0.3 * x / 1.8 + 0.02 * np.random.default_rng(0).standard_normal(len(t))
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return b.getvalue()


async def create_voice(tts: Server, name: str, ref_text: str = "") -> dict:
    form = aiohttp.FormData()
    form.add_field("name", name)
    if ref_text:  # an in-context clone
        form.add_field("ref_text", ref_text)
    form.add_field("audio_sample", reference_wav(), filename="ref.wav",
                   content_type="audio/wav")
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{tts.http_port}/v1/audio/voices", data=form) as r:
        body = await r.json()
        assert r.status == 200, body
        return body["voice"]


@pytest.fixture(scope="module")
def base_tts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tts-base")
    s = Server("tts", "voice_tts.server", "tts", "TTS", tmp, TTS_MODEL="preset:tiny-base",
               TTS_VOICE_DIR=str(tmp / "voices"))
    try:
        s.wait_serving()
        voice = asyncio.run(create_voice(s, "alice"))
        assert voice["name"] == "alice" and voice["kind"] == "clone"
        yield s
    finally:
        s.stop()


def settings_for(tts: Server, **kw: object) -> AgentSettings:
    base: dict[str, object] = dict(
        tts_addr=tts.addr, thinker_addr=f"127.0.0.1:{free_port()}", http_port=0,
        stt_fallback="placeholder", greeting=GREETING, fallback_reply="",
        tts_max_frames=12, tts_seed=1, ws_max_sessions=2,
        admit_max_lag_ms=0,  # no load admission: a busy test host is no refusal here
    )
    base.update(kw)
    return AgentSettings(**base)  # type: ignore[arg-type]


class Agent:
    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.base = f"127.0.0.1:{port}"
        self.url = f"ws://{self.base}{talk.PATH}"
        self.hub = runner.app[talk.TALK_HUB]


async def start_agent(settings: AgentSettings) -> Agent:
    runner = web.AppRunner(make_app(settings))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    agent = Agent(runner, site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    await asyncio.wait_for(agent.hub.ready.wait(), 150)  # prepared, as /healthz says
    return agent


@pytest.fixture
async def agent(base_tts: Server) -> AsyncIterator[Agent]:
    """The agent's default voice is a preset name this Base checkpoint does not have:
    conversations name theirs."""
    a = await start_agent(settings_for(base_tts, tts_voice="serena"))
    yield a
    await a.runner.cleanup()


async def converse(agent: Agent, start: dict, frames: int = 5,
                   timeout: float = 90.0) -> tuple[list[dict], list[bytes], int | None]:
    """Start a conversation, read until `frames` audio frames (or the close); stop."""
    events: list[dict] = []
    audio: list[bytes] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(agent.url) as ws:
        await ws.send_str(json.dumps({"type": "start", "sample_rate": 16000, **start}))
        # a second of mic silence: a client sends audio in real time from the start
        await ws.send_bytes(b"\0" * 640)
        async with asyncio.timeout(timeout):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio.append(msg.data)
                    if len(audio) >= frames:
                        await ws.send_str(json.dumps({"type": "stop"}))
                        break
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    events.append(json.loads(msg.data))
        await ws.close()
        return events, audio, ws.close_code


async def test_v1_voices_lists_the_library_voices_with_their_kind(agent: Agent) -> None:
    async with aiohttp.ClientSession() as http, http.get(
            f"http://{agent.base}{talk.VOICES_PATH}",
            headers={"Origin": "http://127.0.0.1:8000"}) as r:
        assert r.status == 200
        # the page is served next door (the token service's port): it may read the list
        assert r.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
        body = await r.json()
    assert next(v for v in body["voices"] if v["name"] == "alice")["kind"] == "clone"
    assert body["default"] == "serena" and body["default_found"] is False


async def test_a_conversation_in_a_library_voice_gets_its_audio(agent: Agent) -> None:
    events, audio, _ = await converse(agent, {"voice": "Alice"})  # any case, as the TTS
    ready = next(e for e in events if e["type"] == "ready")
    assert ready["voice"] == "alice"
    assert not [e for e in events if e["type"] == "error"], events
    assert len(audio) >= 5 and any(np.frombuffer(f, "<i2").any() for f in audio)
    # its greeting is kept in that voice for the next conversation in it
    cache = agent.hub.caches["alice"]
    async with asyncio.timeout(60):
        while not cache.has(GREETING):
            await asyncio.sleep(0.1)
    assert not agent.hub.cache.has(GREETING)  # never in the default voice's cache


@pytest.mark.parametrize(("voice", "code", "says"), [
    ("nobody", "unknown_voice", "voice 'nobody' is not one of the TTS's voices"),
    ("../alice", "bad_voice", "is not a voice name"),
    (7, "bad_voice", "is not a voice name"),
])
async def test_a_voice_the_tts_does_not_have_is_refused_at_the_start(
        agent: Agent, voice: object, code: str, says: str) -> None:
    events, audio, close_code = await converse(agent, {"voice": voice}, timeout=30)
    assert [e["type"] for e in events] == ["error"] and not audio
    assert events[0]["code"] == code and says in events[0]["message"]
    if code == "unknown_voice":
        assert "alice" in events[0]["message"]  # what there is to pick from
    assert close_code == 1008
    assert agent.hub.talking == 0  # no slot held


async def test_agent_tts_voice_set_to_a_library_voice(base_tts: Server) -> None:
    a = await start_agent(settings_for(base_tts, tts_voice="alice"))
    try:
        assert a.hub.cache.has(GREETING)  # prepared in that voice at start-up
        events, audio, _ = await converse(a, {})
        assert next(e for e in events if e["type"] == "ready")["voice"] == "alice"
        assert len(audio) >= 5
    finally:
        await a.runner.cleanup()


async def test_an_agent_tts_voice_the_tts_lacks_is_an_error_at_start_up(
        base_tts: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="voice_agent")
    async with asyncio.timeout(60):  # at once, not after the starter phrases' retries
        a = await start_agent(settings_for(base_tts, tts_voice="ghost"))
    try:
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("AGENT_TTS_VOICE: voice 'ghost' is not one of the TTS's voices" in m
                   and "alice" in m and "POST /v1/audio/voices" in m for m in errors), errors
    finally:
        await a.runner.cleanup()


async def test_a_reply_in_an_in_context_clone_is_flushed_at_each_sentence(
        base_tts: Server) -> None:
    """An in-context clone's first frame waits for about its reference's frames of text
    (here ~50 tokens) or a flush: the TTS plugin asks the TTS what the voice is and
    flushes at each sentence end, so the first sentence is heard while the reply is still
    being written. An x-vector clone ("alice": no transcript) starts from the first word
    anyway and is not flushed."""
    from voice_agent.plugins import TTS

    await create_voice(base_tts, "carol", ref_text="This is what carol says in the clip.")
    tts = TTS(addr=base_tts.addr, voice="carol", max_frames=6)
    try:
        assert await tts.flushes_sentences("Carol")
        assert not await tts.flushes_sentences("alice")
        assert not await tts.flushes_sentences("nobody")
        stream = tts.stream()
        stream.push_text("Hello there. ")  # the rest of the reply is not written yet
        async with asyncio.timeout(60):
            first = await stream.__anext__()
        assert first.frame.samples_per_channel > 0
        stream.end_input()
        await stream.aclose()
    finally:
        await tts.aclose()
