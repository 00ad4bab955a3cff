"""The TTS plugin against the real TTS server (tiny random preset): streaming, STOP, errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError
from voice_agent.plugins import TTS
from voice_agent.plugins.tts import FRAMES_PER_MESSAGE
from voice_testkit import free_port

from .backends import Server

ONCE = APIConnectOptions(max_retry=0, timeout=10)


def make_tts(addr: str, **kw: object) -> TTS:
    return TTS(addr=addr, voice="aiden", max_frames=12, **kw)  # type: ignore[arg-type]


async def test_text_goes_out_as_it_arrives_and_20ms_frames_come_back(tts_server: Server) -> None:
    tts = make_tts(tts_server.addr)
    stream = tts.stream(conn_options=ONCE)
    frames: list[float] = []
    first_at: list[float] = []

    async def consume() -> None:
        async for ev in stream:
            if not first_at:
                first_at.append(time.perf_counter())
            frames.append(ev.frame.duration)

    task = asyncio.create_task(consume())
    for piece in ["Hel", "lo", " there", ", how", " are", " you"]:
        stream.push_text(piece)
    # no flush yet: the starter's pieces are already on the wire and audio flows back
    async with asyncio.timeout(30):
        while not first_at:
            await asyncio.sleep(0.01)
    assert stream.segments and "Hello there, how are you".startswith("".join(stream.segments))
    stream.end_input()
    async with asyncio.timeout(60):
        await task
    await stream.aclose()
    await tts.aclose()
    # frames are pushed one by one, never batched: 20 ms each, split into 10 ms halves
    # when the framework's emitter releases the tail it holds back (slow CPU synthesis)
    assert len(frames) > 10
    assert max(frames) <= 0.0301
    assert all(round(d * 1000) % 10 == 0 for d in frames)


async def test_stop_ends_the_audio_at_once(tts_server: Server) -> None:
    tts = TTS(addr=tts_server.addr, voice="aiden", max_frames=400)  # ~32 s if not stopped
    stream = tts.stream(conn_options=ONCE)
    got = 0
    stopped_at: float | None = None
    after_stop = 0

    async def consume() -> None:
        nonlocal got, after_stop
        async for _ in stream:
            got += 1
            if stopped_at is not None:
                after_stop += 1

    task = asyncio.create_task(consume())
    stream.push_text("This reply is long enough to take a while to speak out loud. ")
    stream.flush()
    async with asyncio.timeout(30):
        while got < 5:
            await asyncio.sleep(0.005)
    assert tts.stop_all() == 1
    stopped_at = time.perf_counter()
    stream.end_input()
    async with asyncio.timeout(30):
        await task
    await tts.aclose()
    # Nothing received after STOP reaches the output: at most the rest of the message in
    # hand at the decision follows (FRAMES_PER_MESSAGE frames pushed at once).
    assert after_stop <= FRAMES_PER_MESSAGE
    assert got < 100


async def test_unknown_voice_is_a_client_error(tts_server: Server) -> None:
    tts = TTS(addr=tts_server.addr, voice="no-such-voice")
    stream = tts.stream(conn_options=ONCE)
    stream.push_text("hello")
    stream.end_input()
    with pytest.raises(APIStatusError) as e:
        async for _ in stream:
            pass
    assert e.value.status_code == 404 and not e.value.retryable
    await tts.aclose()


async def test_a_tts_that_asks_for_a_key_gets_it_and_refuses_without(tmp_path) -> None:  # type: ignore[no-untyped-def]
    keyed = Server("tts", "voice_tts.server", "tts", "TTS", tmp_path, TTS_MODEL="preset:tiny",
                   TTS_API_KEYS="agent-key-0123456789")
    keyed.wait_serving()
    try:
        async def speak(tts: TTS) -> int:
            stream = tts.stream(conn_options=ONCE)
            stream.push_text("hello there.")
            stream.end_input()
            n = sum([1 async for _ in stream])
            await tts.aclose()
            return n

        assert await speak(TTS(addr=keyed.addr, voice="vivian", max_frames=6,
                               api_key="agent-key-0123456789")) > 0
        with pytest.raises(APIStatusError) as e:
            await speak(TTS(addr=keyed.addr, voice="vivian"))
        assert e.value.status_code == 401 and "missing API key" in str(e.value)
        assert not e.value.retryable
    finally:
        keyed.stop()


async def test_server_down_is_a_connection_error() -> None:
    tts = TTS(addr=f"127.0.0.1:{free_port()}")
    stream = tts.stream(conn_options=ONCE)
    stream.push_text("hello")
    stream.end_input()
    with pytest.raises(APIConnectionError):
        async for _ in stream:
            pass
    await tts.aclose()


async def test_flush_per_sentence_keeps_one_framework_segment(tts_server: Server) -> None:
    # AGENT_BRIDGE_FLUSH_ON_SENTENCE: several server utterances inside one reply
    tts = TTS(addr=tts_server.addr, voice="aiden", max_frames=6, flush_on_sentence=True)
    stream = tts.stream(conn_options=ONCE)
    for piece in ["Hi! ", "Nice to", " meet you. ", "Bye", " now."]:
        stream.push_text(piece)
    stream.end_input()
    n = 0
    async with asyncio.timeout(60):
        async for _ in stream:  # raises on a segment mismatch or missing audio
            n += 1
    await tts.aclose()
    assert n > 0
    assert "".join(stream.segments) == "Hi! Nice to meet you. Bye now."


@pytest.mark.parametrize("attempt", range(5))
async def test_text_over_the_limit_reports_the_servers_status(tts_server: Server,
                                                              attempt: int) -> None:
    # The server ends the call (INVALID_ARGUMENT: over its 4,000 characters) while the
    # plugin still writes text: the error is the server's, not gRPC's INTERNAL for a
    # write that raced the end of the call (grpc/grpc#36066).
    tts = make_tts(tts_server.addr)
    stream = tts.stream(conn_options=ONCE)
    for _ in range(300):
        stream.push_text("word " * 5)
    stream.end_input()
    with pytest.raises(APIStatusError) as e:
        async with asyncio.timeout(60):
            async for _ in stream:
                pass
    await tts.aclose()
    assert e.value.status_code == 400 and "INVALID_ARGUMENT" in str(e.value), str(e.value)


async def test_text_progress_maps_audio_to_the_text_read(tts_server: Server) -> None:
    # Three server utterances (a FLUSH per sentence): the timeline counts characters of
    # the whole reply's text, across them.
    tts = TTS(addr=tts_server.addr, voice="aiden", max_frames=30, flush_on_sentence=True)
    stream = tts.stream(conn_options=ONCE)
    reply = "Hi there! Nice to meet you, héllo. 你好, bye now."
    for i in range(0, len(reply), 5):
        stream.push_text(reply[i:i + 5])
    stream.end_input()
    audio_s = 0.0
    async with asyncio.timeout(60):
        async for ev in stream:
            audio_s += ev.frame.duration
    await tts.aclose()
    assert "".join(stream.segments) == reply
    progress = stream.text_progress
    seconds, chars = [t for t, _ in progress], [c for _, c in progress]
    assert seconds == sorted(seconds) and len(set(seconds)) == len(seconds)
    assert abs(seconds[-1] - audio_s) < 0.05  # what was emitted, nothing more
    assert chars == sorted(chars) and 0 < chars[0] < len(reply)
    assert chars[-1] == len(reply)
    # the second sentence's audio counts past the first sentence's text
    assert any(len("Hi there! ") <= c < len(reply) for c in chars)
    assert stream.chars_at(0.0) == chars[0]
    assert stream.chars_at(seconds[3]) == chars[3]
    assert stream.chars_at((seconds[3] + seconds[4]) / 2) == chars[4]
    assert stream.chars_at(1e9) == len(reply)
