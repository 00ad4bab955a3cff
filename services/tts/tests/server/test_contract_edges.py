"""The edges of the contract, on a real server: greedy vs seeds, the frame cap while text
still streams (TRUNCATED), the utterance id that STOPPED / RESET carry, the cancelled
utterances metric, and our client reporting the server's status."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc
from voice_tts.client.api import synthesize

from .conftest import config
from .test_streaming import (
    FLUSH,
    RESET,
    STOP,
    audio,
    drain,
    is_event,
    kinds,
    one_shot,
    read_until,
    text,
)

TEXT = "Hello there, streaming world, how are you today?"


def pcm(resps: list) -> bytes:
    return b"".join(f.pcm for f in audio(resps))


async def test_greedy_ignores_the_seed_and_sampling_follows_it(server) -> None:
    greedy = [pcm(await one_shot(server.addr, config(seed=s), [TEXT])) for s in (1, 2)]
    assert greedy[0] and greedy[0] == greedy[1], "greedy must be argmax in both stages"
    sampled = []
    for s in (1, 2):
        cfg = config(seed=s)
        cfg.sampling.greedy = False
        sampled.append(pcm(await one_shot(server.addr, cfg, [TEXT])))
    assert sampled[0] and sampled[0] != sampled[1]


async def end_mid_text(addr: str, cfg, ended) -> tuple[list, list, list, list]:
    """Text streams in; `ended` marks the response that ends utterance 0 before its
    FLUSH. Then more text and the FLUSH, then a new utterance. Gives the responses up to
    that end, to FLUSHED 0, to FLUSHED 1, and after the half-close."""
    async with grpc.aio.insecure_channel(addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text("This sentence streams on and on, word after word, "))
        first = await read_until(call, ended)
        # The rest belongs to the ended utterance: dropped, and FLUSH ends it.
        await call.write(text("and still more words for the ended utterance "))
        await call.write(FLUSH)
        flushed = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(text("A new one."))
        await call.write(FLUSH)
        after = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.done_writing()
        rest = await drain(call)
    frames = audio(first)
    assert len(frames) == 3 * 80 // 20 and {f.utterance_id for f in frames} == {0}
    assert kinds(flushed) == ["FLUSHED"] and flushed[0].event.utterance_id == 0
    new = audio(after)
    assert new and {f.utterance_id for f in new} == {1} and new[0].seq == len(frames)
    assert after[-1].event.utterance_id == 1
    return first, flushed, after, rest


async def test_frame_cap_while_text_streams_truncates_until_flush(server) -> None:
    cfg = config()
    cfg.sampling.max_frames = 3
    capped, _, after, rest = await end_mid_text(server.addr, cfg,
                                                is_event(tts_pb2.Event.TRUNCATED))
    frames = audio(capped)
    assert frames[-1].last_in_utterance and kinds(capped)[-2:] == ["A", "TRUNCATED"]
    assert capped[-1].event.utterance_id == 0 and capped[-1].event.next_seq == len(frames)
    assert kinds(after)[0] == "FIRST_AUDIO"
    assert kinds(rest) == ["FLUSHED"]  # half-close: an empty FLUSH


async def test_model_end_while_text_streams_holds_the_utterance_until_flush(
        make_server) -> None:
    """The model's EOS before the FLUSH (the engine's test hook: the 3rd step samples
    EOS) ends the audio; the text until the FLUSH is dropped and the FLUSH answered for
    utterance 0. Before, that text opened utterance 1 and FLUSHED came for 1 only: two
    H100 open-loop calls with text streamed a word at a time waited for FLUSHED 0 forever."""
    srv = make_server(TTS_TEST_FAULT="eos@3")
    cfg = config()
    cfg.sampling.max_frames = 40
    ended, _, _, _ = await end_mid_text(srv.addr, cfg, lambda r: r.WhichOneof("response")
                                        == "audio" and r.audio.last_in_utterance)
    assert "TRUNCATED" not in kinds(ended)  # the model's end, not a cap


async def test_without_a_cap_the_guard_follows_the_text_length(server) -> None:
    # Random weights never reach codec EOS: the server's guard (engine/length_guard.py,
    # 24 frames + 2 per character) ends the utterance, TRUNCATED, at 24 + 2 x 9 frames.
    cfg = config()
    cfg.sampling.ClearField("max_frames")
    resps = await one_shot(server.addr, cfg, ["Hi there."])
    frames = audio(resps)
    assert len(frames) == (24 + 2 * 9) * 80 // 20, f"{len(frames) * 0.02:.2f} s of audio"
    assert kinds(resps)[-3:] == ["A", "TRUNCATED", "FLUSHED"]


async def test_stopped_and_reset_carry_the_stopped_utterance_id(server) -> None:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=config()))
        await call.write(text("First one."))
        await call.write(FLUSH)
        await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(STOP)  # nothing in progress: the id the next text gets
        idle = (await read_until(call, is_event(tts_pb2.Event.STOPPED)))[-1].event
        await call.write(text("Words that are never flushed "))
        await call.write(RESET)  # drops utterance 1, still taking text
        reset = (await read_until(call, is_event(tts_pb2.Event.RESET)))[-1].event
        await call.write(text("After the reset."))
        await call.done_writing()
        rest = await drain(call)
    assert idle.utterance_id == 1 and reset.utterance_id == 1
    assert {f.utterance_id for f in audio(rest)} == {2} and rest[-1].event.utterance_id == 2


def cancelled(srv) -> float:
    return srv.metric('tts_utterances_total{reason="cancelled"}')


async def test_stops_and_client_cancels_count_as_cancelled(make_server) -> None:
    srv = make_server()
    cfg = config()
    cfg.sampling.max_frames = 200  # still speaking when stopped
    async with grpc.aio.insecure_channel(srv.addr) as ch:
        stub = tts_pb2_grpc.TextToSpeechStub(ch)
        call = stub.Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text(TEXT))
        await call.write(FLUSH)
        await read_until(call, lambda r: r.WhichOneof("response") == "audio")
        await call.write(STOP)
        await call.done_writing()  # ends at once: the STOP's end may never reach the writer
        await drain(call)
        assert cancelled(srv) == 1
        call = stub.Synthesize()
        await call.write(tts_pb2.SynthesizeRequest(config=cfg))
        await call.write(text(TEXT))
        await call.write(FLUSH)
        await read_until(call, lambda r: r.WhichOneof("response") == "audio")
        call.cancel()  # the client goes away mid-utterance
    deadline = time.monotonic() + 10
    while cancelled(srv) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert cancelled(srv) == 2


async def test_ids_up_to_128_printable_characters_are_accepted(server) -> None:
    resps = await one_shot(server.addr, config(session_id="s" * 128, trace_id="t-1 " * 32),
                           ["Hi."])
    assert resps[0].event.config.session_id == "s" * 128 and kinds(resps)[-1] == "FLUSHED"


@pytest.mark.parametrize("attempt", range(20))
async def test_client_reports_the_servers_status_while_still_writing(server,
                                                                     attempt: int) -> None:
    # 100 pieces of 100 characters: the server ends the call (text over its 4,000
    # limit) while the client is still writing. gRPC asyncio reports such a write as
    # INTERNAL over the server's status (grpc/grpc#36066) unless the writer stops.
    pieces = ["word " * 20] * 100
    async with grpc.aio.insecure_channel(server.addr) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await synthesize(ch, pieces, config())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "limit" in (e.value.details() or "")
