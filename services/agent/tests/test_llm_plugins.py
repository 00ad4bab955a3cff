"""The thinker plugins (LLM, STT) against the real thinker (tiny random transformers model)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from livekit import rtc
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError
from livekit.agents.llm import ChatContext
from voice.llm.v1 import thinker_pb2
from voice_agent.metrics import TurnTracker
from voice_agent.plugins import LLM, STT
from voice_agent.plugins.llm import build_messages
from voice_agent.plugins.stt import PLACEHOLDER_PREFIX
from voice_agent.plugins.utterances import UtteranceStore
from voice_testkit import free_port

from .backends import Server, espeak, start_thinker

ONCE = APIConnectOptions(max_retry=0, timeout=10)


def chat(text: str = "hello there, how are you") -> ChatContext:
    ctx = ChatContext.empty()
    ctx.add_message(role="system", content="You are brief.")
    ctx.add_message(role="user", content=text)
    return ctx


async def test_reply_streams_with_ttft(thinker: Server) -> None:
    tracker = TurnTracker()
    llm = LLM(addr=thinker.addr, max_tokens=20, temperature=1.0, seed=3, tracker=tracker)
    text, usage = "", None
    async with llm.chat(chat_ctx=chat(), conn_options=ONCE) as stream:
        async for chunk in stream:
            if chunk.delta and chunk.delta.content:
                text += chunk.delta.content
            if chunk.usage:
                usage = chunk.usage
    await llm.aclose()
    assert text and usage is not None and 0 < usage.completion_tokens <= 20
    turn = tracker.current
    assert turn is not None and turn.llm_first is not None and turn.llm_sent is not None
    assert 0 < turn.llm_first - turn.llm_sent < 5


async def test_max_tokens_0_takes_the_thinkers_default(tmp_path: Path) -> None:
    """Compose's agent asks for 0: each profile's thinker caps the reply with its own
    LLM_DEFAULT_MAX_TOKENS (32 for the random CPU one)."""
    short = start_thinker(tmp_path, LLM_DEFAULT_MAX_TOKENS="7")
    try:
        # seed 1 at temperature 0.3 runs to max_tokens
        llm = LLM(addr=short.addr, max_tokens=0, temperature=0.3, seed=1)
        usage = None
        async with llm.chat(chat_ctx=chat(), conn_options=ONCE) as stream:
            async for chunk in stream:
                usage = chunk.usage or usage
        await llm.aclose()
    finally:
        short.stop()
    assert usage is not None and usage.completion_tokens == 7


async def test_cancel_aborts_the_generation_in_the_thinker(thinker: Server) -> None:
    # seed 1 at temperature 0.3 runs to max_tokens (seconds of generation on CPU)
    llm = LLM(addr=thinker.addr, max_tokens=400, temperature=0.3, seed=1)
    aborts0 = thinker.metric("llm_aborts_total")
    stream = llm.chat(chat_ctx=chat(), conn_options=ONCE)
    got = 0
    async with asyncio.timeout(30):
        async for chunk in stream:
            if chunk.delta and chunk.delta.content:
                got += 1
                if got == 3:
                    t0 = time.perf_counter()
                    assert llm.cancel_all() == 1
                    break
    await stream.aclose()
    assert stream.cancelled_by_barge_in
    # the thinker saw the cancel and aborted the generation
    async with asyncio.timeout(10):
        while thinker.metric("llm_aborts_total") <= aborts0:
            await asyncio.sleep(0.05)
    assert time.perf_counter() - t0 < 10
    await llm.aclose()


async def test_two_calls_of_one_turn_overlap_at_the_thinker(thinker: Server) -> None:
    """The framework replaces a preemptive generation with the final one within a turn;
    the first call may still be generating at the thinker when the second arrives (its
    abort in flight). Both must be served: each call of a turn has its own request_id."""
    tracker = TurnTracker()
    tracker.user_turn_ended(tracker.end_of_speech(time.perf_counter(), 0.2))
    # seed 1 at temperature 0.3 runs to max_tokens (seconds of generation on CPU)
    llm = LLM(addr=thinker.addr, max_tokens=400, temperature=0.3, seed=1, tracker=tracker)
    first = llm.chat(chat_ctx=chat(), conn_options=ONCE)
    async with asyncio.timeout(30):
        async for chunk in first:
            if chunk.delta and chunk.delta.content:
                break  # the first call is generating now
        second_text = ""
        async with llm.chat(chat_ctx=chat("and now?"), conn_options=ONCE) as second:
            async for chunk in second:
                if chunk.delta and chunk.delta.content:
                    second_text += chunk.delta.content
                    break
    await first.aclose()
    await llm.aclose()
    assert second_text
    turn = tracker.current
    assert turn is not None
    assert (first.request_id, second.request_id) == (turn.trace_id, f"{turn.trace_id}-2")


def test_context_is_a_bounded_window() -> None:
    ctx = ChatContext.empty()
    ctx.add_message(role="system", content="sys")
    ctx.add_message(role="assistant", content="greeting")
    for i in range(30):
        ctx.add_message(role="user", content=f"u{i}")
        ctx.add_message(role="assistant", content=f"a{i}")
    ctx.add_message(role="user", content="last")
    system, msgs = build_messages(ctx, max_messages=16)
    assert system == "sys"
    assert len(msgs) <= 16 and msgs[0].role == thinker_pb2.ROLE_USER
    assert msgs[-1].parts[0].text == "last"


async def test_thinker_down_is_a_connection_error() -> None:
    llm = LLM(addr=f"127.0.0.1:{free_port()}")
    with pytest.raises(APIConnectionError):
        async with llm.chat(chat_ctx=chat(), conn_options=ONCE) as stream:
            async for _ in stream:
                pass
    await llm.aclose()


def _speechlike(seconds: float = 1.0) -> rtc.AudioFrame:
    t = np.arange(int(16000 * seconds)) / 16000
    pcm = (np.sin(2 * np.pi * 180 * t) * 8000).astype(np.int16)
    return rtc.AudioFrame(data=pcm.tobytes(), sample_rate=16000, num_channels=1,
                          samples_per_channel=len(pcm))


async def test_stt_transcribes_the_utterance_through_the_thinker(thinker: Server,
                                                                 tmp_path: Path) -> None:
    # the session thinker has an ASR step: the audio part is heard, text comes back
    tracker = TurnTracker()
    stt = STT(addr=thinker.addr, fallback="none", tracker=tracker)
    speech = espeak("Good morning, how are you?", tmp_path)
    frame = rtc.AudioFrame(data=speech.tobytes(), sample_rate=16000, num_channels=1,
                           samples_per_channel=len(speech))
    ev = await stt.recognize([frame], conn_options=ONCE)
    text = ev.alternatives[0].text
    assert text and not text.startswith(PLACEHOLDER_PREFIX)
    assert stt.audio_rejected == 0 and tracker._stt is not None and tracker._stt[1] is not None
    await stt.aclose()


async def test_stt_on_a_text_only_thinker_uses_its_named_fallback(tmp_path: Path) -> None:
    text_only = start_thinker(tmp_path)  # no ASR step: audio is INVALID_ARGUMENT
    try:
        strict = STT(addr=text_only.addr, fallback="none")
        with pytest.raises(APIStatusError) as e:
            await strict.recognize([_speechlike()], conn_options=ONCE)
        assert e.value.status_code == 400 and not e.value.retryable
        placeholder = STT(addr=text_only.addr, fallback="placeholder")
        ev = await placeholder.recognize([_speechlike(1.5)], conn_options=ONCE)
        assert ev.alternatives[0].text == "[untranscribed speech, 1.5 s]"
        assert placeholder.audio_rejected == 1
        await strict.aclose()
        await placeholder.aclose()
    finally:
        text_only.stop()


def test_utterance_markers_become_audio_parts() -> None:
    store = UtteranceStore(capacity=2)
    pcm = b"\x01\x00" * 16000
    marker = store.put(pcm)
    assert marker == "[utterance 1, 1.0 s]"
    ctx = ChatContext.empty()
    ctx.add_message(role="user", content=marker)
    ctx.add_message(role="assistant", content=marker)  # only user text is swapped
    _, msgs = build_messages(ctx, max_messages=8, utterances=store)
    assert msgs[0].parts[0].audio.data == pcm and msgs[0].parts[0].audio.sample_rate == 16000
    assert msgs[1].parts[0].text == marker
    store.put(pcm)
    store.put(pcm)  # capacity 2: utterance 1 is forgotten, its marker stays text
    _, msgs = build_messages(ctx, max_messages=8, utterances=store)
    assert msgs[0].parts[0].text == marker


async def test_an_earlier_turn_goes_as_its_words_once_heard_the_newest_as_audio() -> None:
    """Audio mode: re-sending every past turn's audio made each prompt grow with the call;
    an earlier turn whose words the background ear has said goes as those words."""
    store = UtteranceStore()
    first, second, third = (store.put(bytes([n, 0]) * 8000) for n in (1, 2, 3))
    store.heard(first, "what is the weather")
    store.heard(third, "and tomorrow")  # the newest: still its audio
    ctx = ChatContext.empty()
    for marker in (first, second, third):
        ctx.add_message(role="user", content=marker)
        ctx.add_message(role="assistant", content="ok")
    ctx.items.pop()  # the newest turn is the user's
    _, msgs = build_messages(ctx, max_messages=8, utterances=store)
    kinds = [m.parts[0].WhichOneof("part") for m in msgs if m.role == thinker_pb2.ROLE_USER]
    assert kinds == ["text", "audio", "audio"]  # the second: not heard yet
    assert msgs[0].parts[0].text == "what is the weather"
    # the page's transcript waits for the words; without them, the marker
    assert await store.wait_words(first) == "what is the weather"
    assert await store.wait_words(second, timeout_s=0.05) == second
    store.heard(second, None)  # the ear could not say
    assert await store.wait_words(second) == second
    assert await store.wait_words("plain text") == "plain text"


async def test_a_keyed_thinker_gets_the_agents_key(tmp_path: Path) -> None:
    # the thinker asks for a key (LLM_API_KEYS); the plugins send AGENT_LLM_API_KEY's
    keyed = start_thinker(tmp_path, LLM_API_KEYS="agent-key-0123456789")
    try:
        async def reply(llm: LLM) -> str:
            text = ""
            async with llm.chat(chat_ctx=chat(), conn_options=ONCE) as stream:
                async for chunk in stream:
                    text += chunk.delta.content if chunk.delta and chunk.delta.content else ""
            await llm.aclose()
            return text

        with pytest.raises(APIStatusError) as e:
            await reply(LLM(addr=keyed.addr, max_tokens=4, seed=3))
        assert "UNAUTHENTICATED" in str(e.value) and "missing API key" in str(e.value)
        assert await reply(LLM(addr=keyed.addr, max_tokens=4, seed=3,
                               api_key="agent-key-0123456789"))
        stt = STT(addr=keyed.addr, fallback="placeholder", api_key="agent-key-0123456789")
        ev = await stt.recognize([_speechlike(1.0)], conn_options=ONCE)  # text-only: rejected
        assert ev.alternatives[0].text.startswith(PLACEHOLDER_PREFIX)  # got in, then a 400
        await stt.aclose()
        assert "agent-key-0123456789" not in keyed.log_path.read_text()
    finally:
        keyed.stop()
