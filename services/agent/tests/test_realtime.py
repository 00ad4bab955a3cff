"""The OpenAI Realtime API (GET /v1/realtime, voice_agent/realtime/) driven by the clients
people have: the `openai` SDK's realtime client (GA events; and beta names with the
`OpenAI-Beta: realtime=v1` header), pointed at the agent's real HTTP app on a localhost
port with the real tiny TTS and thinker. Speech is espeak-ng's; the ear the offline one.

What a client meets: a spoken turn on server VAD answered with audio, a text turn, G.711,
barge-in that cancels the reply and truncates its item to what was heard, the client's
own truncate, items deleted, bad events each answered with an `error` event and the
session still usable, a client that vanishes leaving no response behind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from voice_agent.realtime import events as rt_events
from voice_agent.realtime.session import heard_text

from .backends import Server, espeak
from .test_ws_talk import Agent, serve, settings_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def agent(tts_server: Server, thinker: Server) -> AsyncIterator[Agent]:
    # a reply of ~40 tokens and at most 3.2 s of audio: long enough to cut, short to wait;
    # no starter phrases (the Realtime API has no greeting of its own)
    a = await serve(settings_for(tts_server, thinker, llm_max_tokens=40, tts_max_frames=40,
                                 ws_max_sessions=4, starter_cache=False))
    yield a
    await a.runner.cleanup()


def client(agent: Agent, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{agent.http}/v1", api_key="none", **kw)


def at_24k(pcm16k: np.ndarray) -> np.ndarray:
    t_in = np.arange(len(pcm16k)) / 16000
    t_out = np.arange(len(pcm16k) * 3 // 2) / 24000
    return np.interp(t_out, t_in, pcm16k.astype(np.float32)).astype(np.int16)


def b64(pcm: np.ndarray | bytes) -> str:
    return base64.b64encode(pcm if isinstance(pcm, bytes) else pcm.tobytes()).decode()


class Events:
    """Every server event of a connection, as the JSON sent, in order; each also parsed
    by the SDK into its typed event (GA connections: the type must be the one sent)."""

    def __init__(self, conn: Any, ga: bool = True) -> None:
        self.conn, self.ga = conn, ga
        self.all: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(openai.OpenAIError, ConnectionError, Exception):
            while True:
                raw = await self.conn.recv_bytes()
                ev = json.loads(raw)
                if self.ga:
                    assert self.conn.parse_event(raw).type == ev["type"]
                self.all.append(ev)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.all if e["type"] == kind]

    async def wait(self, kind: str, n: int = 1, timeout: float = 60) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while len(self.of(kind)) < n:
                await asyncio.sleep(0.01)
        return self.of(kind)[n - 1]


async def speak(conn: Any, pcm24k: np.ndarray, realtime: bool = True) -> None:
    """Mic audio as a client streams it: 40 ms appends, paced by the clock."""
    n = 24000 // 25
    t0 = time.perf_counter()
    for i in range(0, len(pcm24k), n):
        await conn.input_audio_buffer.append(audio=b64(pcm24k[i:i + n]))
        if realtime:
            await asyncio.sleep(max(0.0, t0 + (i // n + 1) * 0.04 - time.perf_counter()))


def silence(s: float) -> np.ndarray:
    return np.zeros(int(24000 * s), dtype=np.int16)


async def ask(conn: Any, evs: Events, text: str) -> dict[str, Any]:
    """A user text item, then response.create: the response.done that follows."""
    await conn.conversation.item.create(item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()
    return await evs.wait("response.done")


def audio_of(evs: Events, response_id: str, kind: str = "response.output_audio.delta") -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in evs.of(kind)
                    if e["response_id"] == response_id)


async def test_a_spoken_turn_on_server_vad_is_answered_with_audio(
        agent: Agent, tmp_path: Path) -> None:
    from voice_agent.metrics import REGISTRY

    def answered() -> float:
        return REGISTRY.get_sample_value("agent_eot_to_first_audio_seconds_count") or 0.0

    answered0 = answered()
    question = at_24k(espeak("What is the weather like today?", tmp_path))
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        created = await evs.wait("session.created", timeout=10)
        assert created["session"]["audio"]["output"]["format"]["type"] == "audio/pcm"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        await evs.wait("session.updated", timeout=10)
        await speak(conn, np.concatenate([silence(0.3), question, silence(1.0)]))
        started = await evs.wait("input_audio_buffer.speech_started")
        stopped = await evs.wait("input_audio_buffer.speech_stopped")
        committed = await evs.wait("input_audio_buffer.committed")
        assert started["item_id"] == stopped["item_id"] == committed["item_id"]
        assert 0 <= started["audio_start_ms"] < stopped["audio_end_ms"] <= 5000
        heard = await evs.wait("conversation.item.input_audio_transcription.completed")
        assert heard["item_id"] == committed["item_id"] and heard["transcript"].strip()
        done = await evs.wait("response.done")
    r = done["response"]
    assert r["status"] == "completed", r
    (item,) = r["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["status"] == "completed" and item["content"][0]["type"] == "output_audio"
    pcm = np.frombuffer(audio_of(evs, r["id"]), dtype=np.int16)
    assert len(pcm) > 24000 * 0.3 and np.abs(pcm).max() > 300  # audible 24 kHz pcm16
    deltas = "".join(e["delta"] for e in evs.of("response.output_audio_transcript.delta"))
    assert deltas == item["content"][0]["transcript"] != ""
    # the turn is in the agent's latency metrics, as a /v1/talk turn is
    assert answered() == answered0 + 1
    # captions in step with the voice: each transcript delta comes with the audio that
    # speaks it (the TTS's text position), none before the reply's first audio
    kinds = [e["type"] for e in evs.all if e.get("response_id") == r["id"]]
    audio = [i for i, k in enumerate(kinds) if k == "response.output_audio.delta"]
    captions = [i for i, k in enumerate(kinds) if k == "response.output_audio_transcript.delta"]
    assert captions[0] > audio[0], kinds
    assert len(captions) >= 2 and captions[0] < audio[-1], kinds  # spread over the audio
    assert r["usage"]["output_token_details"]["text_tokens"] > 0
    assert r["usage"]["input_tokens"] > 0
    order = [e["type"] for e in evs.all]
    assert order.index("response.created") < order.index("response.output_item.added") < \
        order.index("response.output_audio.delta") < order.index("response.done")


async def test_a_text_turn_text_only_and_beta_names(agent: Agent) -> None:
    async with client(agent).realtime.connect(
            model="voice-agent", extra_headers={"OpenAI-Beta": "realtime=v1"}) as conn:
        evs = Events(conn, ga=False)
        created = await evs.wait("session.created", timeout=10)
        assert created["session"]["input_audio_format"] == "pcm16"  # the beta shape
        await conn.send({"type": "session.update", "session": {
            "modalities": ["text"], "turn_detection": None}})
        await evs.wait("session.updated", timeout=10)
        await conn.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Hello there!"}]}})
        await evs.wait("conversation.item.created", timeout=10)
        await conn.send({"type": "response.create"})
        done = await evs.wait("response.done")
    r = done["response"]
    assert r["status"] == "completed"
    text = "".join(e["delta"] for e in evs.of("response.text.delta"))
    assert text and r["output"][0]["content"][0] == {"type": "text", "text": text}
    assert not evs.of("response.audio.delta") and not evs.of("response.output_audio.delta")


async def test_g711_in_and_out(agent: Agent, tmp_path: Path) -> None:
    speech16k = espeak("Hello, can you hear me?", tmp_path)
    at8k = speech16k[::2]
    ulaw = rt_events.encode_g711(at8k, "g711_ulaw")
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcmu"}}}})
        updated = await evs.wait("session.updated", timeout=10)
        assert updated["session"]["audio"]["output"]["format"]["type"] == "audio/pcmu"
        for i in range(0, len(ulaw), 800):
            await conn.input_audio_buffer.append(audio=b64(ulaw[i:i + 800]))
        await conn.input_audio_buffer.commit()
        heard = await evs.wait("conversation.item.input_audio_transcription.completed")
        assert heard["transcript"].strip()
        await conn.response.create()
        done = await evs.wait("response.done")
    out = audio_of(evs, done["response"]["id"])
    pcm = rt_events.decode_g711(out, "g711_ulaw")  # 8 kHz, one byte a sample
    assert len(out) > 8000 * 0.3 and np.abs(pcm).max() > 300


async def test_barge_in_cancels_and_keeps_only_what_was_heard(
        agent: Agent, tmp_path: Path) -> None:
    question = at_24k(espeak("Tell me a long story about the sea.", tmp_path))
    interrupt = at_24k(espeak("Stop, stop please.", tmp_path))
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await speak(conn, np.concatenate([silence(0.3), question, silence(0.9)]))
        await evs.wait("response.output_audio.delta", timeout=60)
        first_audio = time.monotonic()
        heard_s = 0.8
        await speak(conn, silence(heard_s - 0.1))
        await speak(conn, np.concatenate([interrupt, silence(0.8)]))
        done = await evs.wait("response.done")
        cut_after = time.monotonic() - first_audio
        await evs.wait("input_audio_buffer.speech_started", n=2)
        r = done["response"]
        await conn.send({"type": "conversation.item.retrieve", "item_id": r["output"][0]["id"]})
        kept = (await evs.wait("conversation.item.retrieved"))["item"]["content"][0]["transcript"]
        done_after = time.monotonic() - first_audio
    order = [e["type"] for e in evs.all]
    second_speech = [i for i, t in enumerate(order) if t.endswith("speech_started")][1]
    sent_ms = len(audio_of(evs, r["id"])) / 48
    full = "".join(e["delta"] for e in evs.of("response.output_audio_transcript.delta")
                   if e["response_id"] == r["id"])
    truncated = evs.of("conversation.item.truncated")
    if second_speech > order.index("response.done"):
        # the reply was all made (the TTS runs ahead of real time) before the caller spoke:
        # it stays completed, and its item is cut only if its audio was still playing
        assert r["status"] == "completed", r
        if not truncated:
            assert kept == full
            return
        assert truncated[0]["audio_end_ms"] < sent_ms  # cut while it still played
        cut_after = done_after  # the cut came with the speech, after response.done
    else:
        assert r["status"] == "cancelled", r
        assert r["status_details"]["reason"] == "turn_detected"
        assert r["output"][0]["status"] == "incomplete"
        assert r["output"][0]["content"][0]["transcript"] == kept
    assert truncated and truncated[0]["item_id"] == r["output"][0]["id"]
    end_ms = truncated[0]["audio_end_ms"]
    # heard: the time since its first audio, but never more audio than was sent (a TTS on
    # a busy CPU host makes it slower than real time)
    assert min(heard_s * 1000, sent_ms) * 0.8 < end_ms <= min(cut_after * 1000, sent_ms) + 1
    # the captions came with the audio sent, so they hold at least what was heard
    assert full.startswith(kept) and len(kept) <= len(full)
    # the speech that cut it is the next turn (and may already be answered)
    assert len(evs.of("input_audio_buffer.committed")) >= 1


async def test_a_backchannel_over_a_reply_neither_cuts_it_nor_opens_a_turn(
        agent: Agent, tmp_path: Path) -> None:
    """The Realtime door's barge-in is /v1/talk's (duplex.py): "Yeah." over a reply pauses
    it, and its words resume it. The client hears nothing of that speech (no
    speech_started: a client stops its playout on one), the response completes whole, and
    no turn is committed. It used to cancel the reply on any speech, a cough included."""
    from voice_agent.metrics import REGISTRY

    def resumed() -> float:
        return REGISTRY.get_sample_value("agent_backchannels_total") or 0.0

    yeah = at_24k(espeak("Yeah.", tmp_path))
    for question in ("Tell me a long story about the sea.", "Describe the ocean at night.",
                     "Tell me about ships and sailors."):
        before = resumed()
        async with client(agent).realtime.connect(model="voice-agent") as conn:
            evs = Events(conn)
            await evs.wait("session.created", timeout=10)
            await ask_only(conn, question)
            await evs.wait("response.output_audio.delta", timeout=60)
            await speak(conn, np.concatenate([silence(0.2), yeah]))
            if evs.of("response.done"):
                continue  # the reply was over before "Yeah": proves nothing, next one
            await speak(conn, silence(1.2))
            done = await evs.wait("response.done", timeout=60)
        break
    else:
        raise AssertionError("every reply was over before the backchannel")
    assert resumed() == before + 1  # paused, then resumed on its words
    assert done["response"]["status"] == "completed", done["response"]
    assert not evs.of("input_audio_buffer.speech_started"), evs.of("error")
    assert not evs.of("input_audio_buffer.committed")
    assert not evs.of("conversation.item.truncated")
    assert len(evs.of("response.created")) == 1  # "Yeah" is answered by nothing


async def ask_only(conn: Any, text: str) -> None:
    await conn.conversation.item.create(item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()


async def test_client_truncate_delete_and_retrieve(agent: Agent) -> None:
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={"type": "realtime", "audio": {
            "input": {"turn_detection": None}}})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Say something."}]})
        await conn.response.create()
        done = await evs.wait("response.done")
        item = done["response"]["output"][0]
        audio_ms = len(audio_of(evs, done["response"]["id"])) / 48
        await conn.conversation.item.truncate(item_id=item["id"], content_index=0,
                                              audio_end_ms=int(audio_ms // 2))
        t = await evs.wait("conversation.item.truncated", timeout=10)
        assert t["audio_end_ms"] == int(audio_ms // 2)
        await conn.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
        got = await evs.wait("conversation.item.retrieved", timeout=10)
        assert item["content"][0]["transcript"].startswith(
            got["item"]["content"][0]["transcript"])
        await conn.conversation.item.delete(item_id=item["id"])
        assert (await evs.wait("conversation.item.deleted", timeout=10))["item_id"] == item["id"]
        await conn.conversation.item.delete(item_id=item["id"])
        err = await evs.wait("error", timeout=10)
        assert err["error"]["code"] == "item_not_found"


async def test_bad_events_get_errors_and_the_session_goes_on(agent: Agent) -> None:
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await evs.wait("session.created", timeout=10)
        bad: list[tuple[Any, str]] = [
            ("{not json", "invalid_json"),
            (json.dumps({"type": "no.such.event", "event_id": "e1"}), "invalid_event"),
            (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
            (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}),
             "invalid_value"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")}),
             "invalid_value"),  # half a sample
            (json.dumps({"type": "session.update", "session": {"voice": "nobody-here"}}),
             "invalid_value"),
            (json.dumps({"type": "session.update", "session": {
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}),
             "invalid_value"),
            (json.dumps({"type": "session.update", "session": {"tool_choice": {
                "type": "function", "name": "missing"}}}), "invalid_value"),
            (json.dumps({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": "nope", "output": "x"}}),
             "invalid_value"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (20 * 2**20)}),
             "invalid_value"),  # a 20 MB append
        ]
        for raw, _ in bad:
            await conn.send_raw(raw)
        async with asyncio.timeout(30):
            while len(evs.of("error")) < len(bad):
                await asyncio.sleep(0.01)
        codes = [e["error"]["code"] for e in evs.of("error")]
        assert codes == [c for _, c in bad], codes
        assert all(e["error"]["type"] == "invalid_request_error" for e in evs.of("error"))
        assert evs.of("error")[1]["error"]["event_id"] == "e1"
        # still usable: a text turn is answered
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Are you there?"}]})
        await conn.response.create()
        await conn.response.create()  # one at a time
        done = await evs.wait("response.done")
        assert done["response"]["status"] == "completed"
        assert evs.of("error")[-1]["error"]["code"] == "conversation_already_has_active_response"


async def test_a_vanished_client_leaves_no_response(
        agent: Agent, thinker: Server, tts_server: Server) -> None:
    conn = await client(agent).realtime.connect(model="voice-agent").enter()
    evs = Events(conn)
    await conn.conversation.item.create(item={
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Tell me everything."}]})
    await conn.response.create()
    await evs.wait("response.output_audio.delta", timeout=60)
    assert tts_server.metric("tts_active_sessions") >= 1  # the reply is still being made
    await conn.close()  # gone mid-reply
    async with asyncio.timeout(10):
        while agent.hub.sockets or agent.hub.talking:
            await asyncio.sleep(0.05)
    async with asyncio.timeout(10):  # the TTS stream and any thinker call are stopped
        while tts_server.metric("tts_active_sessions") or \
                thinker.metric("llm_active_requests"):
            await asyncio.sleep(0.1)
    tasks = [t for t in asyncio.all_tasks() if (t.get_name() or "").startswith("rt-")]
    assert not [t for t in tasks if not t.done()], tasks


def test_heard_text_cuts_at_a_whole_word() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    assert heard_text(text, 1000, 1000, True) == text
    assert heard_text(text, 500, 1000, True) == "The quick brown fox"  # 22 chars: "jumps" cut
    assert heard_text(text, 0, 1000, True) == ""
    # before all audio is made: the speaking pace (14 characters a second)
    assert heard_text(text, 1000, 1200, False) == "The quick"
    # the TTS said what it had read by then: that, to the word
    assert heard_text(text, 1000, 1200, False, read=25) == "The quick brown fox jumps"
    assert heard_text(text, 1000, 1200, False, read=22) == "The quick brown fox"  # "jum"
    assert heard_text(text, 1000, 1200, False, read=3) == "The"


async def _reply(gen: Any, timeout: float = 60) -> tuple[str, int]:
    """A LiveKit generation read to its end: (its text, its audio samples)."""
    text, samples = "", 0
    async with asyncio.timeout(timeout):
        async for msg in gen.message_stream:
            async def read_text(m: Any = msg) -> str:
                return "".join([str(t) async for t in m.text_stream])

            async def read_audio(m: Any = msg) -> int:
                return sum([f.samples_per_channel async for f in m.audio_stream])

            t, n = await asyncio.gather(read_text(), read_audio())
            text, samples = text + t, samples + n
    return text, samples


async def test_livekit_realtime_model_talks_to_us(agent: Agent, tmp_path: Path) -> None:
    """livekit-plugins-openai's RealtimeModel, the Realtime LLM of a LiveKit agent, with its
    base URL on our agent: a reply it asks for, then a spoken turn on server VAD."""
    import aiohttp
    from livekit import rtc
    from livekit.plugins import openai as lk_openai

    async with aiohttp.ClientSession() as http:
        model = lk_openai.realtime.RealtimeModel(
            base_url=f"{agent.http}/v1", api_key="none", model="voice-agent", voice="aiden",
            http_session=http)
        sess = model.session()
        errors: list[Any] = []
        sess.on("error", errors.append)
        generations: list[Any] = []
        sess.on("generation_created", generations.append)
        try:
            gen = await asyncio.wait_for(sess.generate_reply(instructions="Say hello."), 60)
            text, samples = await _reply(gen)
            assert text and samples > 24000 * 0.3, (text, samples)
            # a spoken turn: the plugin streams the mic; our server VAD ends the turn
            speech = at_24k(espeak("Hello, how are you?", tmp_path))
            pcm = np.concatenate([silence(0.3), speech, silence(1.2)])
            n0 = len(generations)
            for i in range(0, len(pcm), 480):
                chunk = pcm[i:i + 480]
                sess.push_audio(rtc.AudioFrame(chunk.tobytes(), 24000, 1, len(chunk)))
                await asyncio.sleep(0.02)
            async with asyncio.timeout(60):
                while len(generations) == n0:
                    await asyncio.sleep(0.05)
            text2, samples2 = await _reply(generations[-1])
            assert samples2 > 0 and text2
            users = [i for i in sess.chat_ctx.items if getattr(i, "role", None) == "user"]
            assert users and users[-1].text_content, sess.chat_ctx.items
        finally:
            await sess.aclose()
            await model.aclose()
    assert not errors, errors


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
               "required": ["city", "unit"], "additionalProperties": False}}


async def test_a_forced_client_tool_call_and_its_output(
        agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """tool_choice names the client's function: the response is a function_call whose
    arguments validate (constrained decoding, even from random weights); the client's
    function_call_output goes to the thinker and the next response answers it."""
    import jsonschema
    from livekit.agents import llm as lk_llm
    from voice_agent.plugins import LLM

    contexts: list[lk_llm.ChatContext] = []
    chat = LLM.chat

    def spy(self: LLM, **kw: Any) -> Any:
        contexts.append(kw["chat_ctx"].copy())
        return chat(self, **kw)

    monkeypatch.setattr(LLM, "chat", spy)
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={
            "type": "realtime", "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 400,  # room for the whole call (random weights ramble)
            "audio": {"input": {"turn_detection": None}}})
        await evs.wait("session.updated", timeout=10)
        done = await ask(conn, evs, "What is the weather in Oslo?")
        calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
        assert calls and calls[0]["name"] == "get_weather", (done["response"], evs.of("error"))
        call = calls[0]
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
        args_done = await evs.wait("response.function_call_arguments.done", timeout=5)
        assert args_done["arguments"] == call["arguments"]
        deltas = "".join(e["delta"] for e in evs.of("response.function_call_arguments.delta"))
        assert deltas == call["arguments"]
        # the client ran it: its output, then a reply (tool_choice back to auto)
        await conn.session.update(session={"type": "realtime", "tool_choice": "none"})
        await conn.conversation.item.create(item={
            "type": "function_call_output", "call_id": call["call_id"],
            "output": '{"temperature": 21, "sky": "clear"}'})
        await conn.response.create()
        done2 = await evs.wait("response.done", 2)
    assert done2["response"]["status"] == "completed"
    assert done2["response"]["output"][0]["type"] == "message"
    outputs = [i for i in contexts[-1].items if i.type == "function_call_output"]
    assert outputs and outputs[0].output == '{"temperature": 21, "sky": "clear"}'
    assert outputs[0].call_id == call["call_id"]


async def test_random_bad_events_never_give_a_server_error(agent: Agent) -> None:
    """A seeded random run of 1,000 client events (VOICE_RANDOM_N), on one session:
    mutated real events (odd values in their fields), junk JSON, binary. Each is
    answered as the API says, an `error` is an invalid_request_error; the socket stays
    open and a text turn is answered afterwards. (Invalid UTF-8 in a text frame closes
    the socket 1007, as RFC 6455 says: test_invalid_utf8_closes_1007.)"""
    import os
    import random

    import aiohttp

    seed, n = 20261127, int(os.environ.get("VOICE_RANDOM_N", 0)) or 1000
    rng = random.Random(seed)
    odd = [None, True, -1, 0, 1.5, "x", "", "\ud800", [], {}, "x" * 3000, 2**64, 1e308,
           {"type": "function"}, [{"type": "message"}], "AAAA", "root"]
    fields = ["session", "audio", "item", "item_id", "previous_item_id", "content_index",
              "audio_end_ms", "response", "response_id", "event_id", "type"]
    types = [t for t in rt_events.CLIENT_EVENTS if t != "response.create"]

    def event() -> tuple[str, Any]:
        roll = rng.random()
        if roll < 0.7:
            ev: dict[str, Any] = {"type": rng.choice(types)}
            for _ in range(rng.randint(0, 3)):
                ev[rng.choice(fields)] = rng.choice(odd)
            if rng.random() < 0.3:
                ev["session"] = {rng.choice(["voice", "tools", "tool_choice", "temperature",
                                             "turn_detection", "audio", "instructions",
                                             "max_output_tokens", "output_modalities"]):
                                 rng.choice(odd)}
            return "text", json.dumps(ev)
        if roll < 0.85:
            return "text", rng.choice(["", "{", "[]", "null", "1", '"x"', "[" * 3000 + "]" * 3000])
        return "binary", bytes(rng.randrange(256) for _ in range(rng.randint(0, 100)))

    url = f"ws://127.0.0.1:{agent.http.rsplit(':', 1)[1]}/v1/realtime"
    got: list[dict[str, Any]] = []
    answered = asyncio.Event()  # a completed response.done came

    async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
        # Read while sending, as a client does: aiohttp's client stops reading its socket
        # past its buffer's limit, and 1,000 unread answers once stalled this test.
        async for msg in ws:
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            got.append(json.loads(msg.data))
            if got[-1]["type"] == "response.done" and \
                    got[-1]["response"]["status"] == "completed":
                answered.set()

    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        reader = asyncio.create_task(read(ws))
        for _ in range(n):
            kind, data = event()
            if kind == "text":
                await ws.send_str(str(data).encode("utf-8", "surrogatepass")
                                  .decode("utf-8", "replace"))
            else:
                await ws.send_bytes(data)
        await ws.send_json({"type": "session.update", "session": {
            "voice": "aiden", "output_modalities": ["text"], "tools": [], "tool_choice": "auto",
            "instructions": "Be brief.", "max_output_tokens": 20,
            "audio": {"input": {"turn_detection": None}}}})
        await ws.send_json({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Still there?"}]}})
        await ws.send_json({"type": "response.cancel"})  # whatever is running
        await asyncio.sleep(0.5)
        await ws.send_json({"type": "response.create"})
        try:
            await asyncio.wait_for(answered.wait(), 120)
        except TimeoutError:
            raise AssertionError(f"no completed response in 120 s after {len(got)} events; "
                                 f"the last: {[e['type'] for e in got[-6:]]}") from None
        finally:
            reader.cancel()
    errors = [e["error"] for e in got if e["type"] == "error"]
    assert len(errors) > n // 4, len(errors)
    assert all(e["type"] == "invalid_request_error" for e in errors), \
        [e for e in errors if e["type"] != "invalid_request_error"][:3]
    assert not [e for e in got if e["type"] == "response.done"
                and e["response"]["status"] == "failed"]


async def test_invalid_utf8_closes_1007(agent: Agent) -> None:
    import aiohttp

    url = f"ws://127.0.0.1:{agent.http.rsplit(':', 1)[1]}/v1/realtime"
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_frame(b'{"type": "session.update", "x": "\xff\xfe"}',
                            aiohttp.WSMsgType.TEXT)
        async with asyncio.timeout(10):
            async for _ in ws:
                pass
    assert ws.close_code == 1007
    async with asyncio.timeout(10):  # its slot is free again
        while agent.hub.talking:
            await asyncio.sleep(0.05)


async def test_each_sessions_turn_detection_is_its_own() -> None:
    """Silero's streams share their VAD's options: a session's silence_duration_ms and
    threshold go to its own stream, not to the agent's VAD or another session's."""
    from voice_agent.conversation.parts import load_vad
    from voice_agent.realtime.session import RealtimeSession
    from voice_agent.settings import AgentSettings

    async def check(_: str) -> str:
        return "aiden"

    s = AgentSettings(tts_voice="aiden", vad_silence_ms=200)
    a = RealtimeSession(s, lambda _: None, beta=False, check_voice=check)
    b = RealtimeSession(s, lambda _: None, beta=False, check_voice=check)
    a.start()
    b.start()
    try:
        await a.handle(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 700,
                               "threshold": 0.8}}}}}))
        a_streams, b_streams = a.pipeline.vad.streams, b.pipeline.vad.streams
        assert a_streams and b_streams  # the conversation's own (its turns', its ear's)
        for stream in a_streams:
            assert stream.inner._opts.min_silence_duration == 0.7
            assert stream.inner._opts.activation_threshold == 0.8
        for stream in b_streams:  # the other session: as it was
            assert stream.inner._opts.min_silence_duration == 0.2
        assert load_vad(s).min_silence_duration == 0.2  # the agent's VAD too
    finally:
        await a.close()
        await b.close()


def test_an_event_quoting_a_lone_surrogate_still_goes_out_as_utf8() -> None:
    """A client's "\\ud800" escape quoted back in an error: sending it raised in the
    session's sender and ended the session (the random-events test found it)."""
    from voice_agent.realtime.session import wire_json

    for ev in ({"type": "error", "message": "unknown event type '\ud800'"},
               {"type": "x", "text": "héllo 你好"}):
        text = wire_json(ev)
        text.encode("utf-8")  # would raise for a lone surrogate
        assert json.loads(text) == ev
    assert "你好" in wire_json({"text": "你好"})  # valid text stays unescaped


async def test_a_forced_call_cut_by_its_token_limit_is_never_spoken(agent: Agent) -> None:
    """tool_choice "required" with a free string argument and too few tokens for the
    call: the thinker drops the unclosed `<tool_call>` (no text), the response says
    "incomplete" (max_output_tokens), and nothing of it reaches the TTS."""
    note = {"type": "function", "name": "take_note", "description": "Write a note.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                           "required": ["text"]}}
    async with client(agent).realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={
            "type": "realtime", "tools": [note], "tool_choice": "required",
            "max_output_tokens": 6, "audio": {"input": {"turn_detection": None}}})
        await evs.wait("session.updated", timeout=10)
        done = await ask(conn, evs, "Note that the milk is out.")
    r = done["response"]
    assert r["status"] == "incomplete", r
    assert r["status_details"]["reason"] == "max_output_tokens"
    assert r["output"] == [] and not evs.of("response.output_audio.delta")
    assert not evs.of("response.output_audio_transcript.delta")
