"""AudioFrame.text_chars over a real server: how much of its utterance's text the model
had read by each message's last frame. Non-decreasing, over 0 from the first message, all
of the text (code points, as sent) at the utterance's end, from 0 again after a FLUSH;
with frames_per_message n, the value of the message's last frame."""

from __future__ import annotations

import grpc
import pytest
from voice.tts.v1 import tts_pb2

from .conftest import config
from .test_streaming import FLUSH, audio, drain, is_event, one_shot, open_call, read_until, text

SENTENCE = "Hello there, héllo 你好. Streaming world!"


def check_utterance(frames: list[tts_pb2.AudioFrame], text_len: int) -> list[int]:
    chars = [f.text_chars for f in frames]
    assert chars and chars[0] > 0, chars
    assert chars == sorted(chars), chars
    assert chars[-1] == text_len and frames[-1].last_in_utterance, (chars, text_len)
    assert chars[0] < text_len, "a streamed utterance starts before all of it is read"
    return chars


async def test_streamed_sentence_reads_to_its_end(server) -> None:
    cfg = config(seed=5)
    cfg.sampling.max_frames = 40
    pieces = [SENTENCE[i:i + 4] for i in range(0, len(SENTENCE), 4)]
    frames = audio(await one_shot(server.addr, cfg, pieces))
    check_utterance(frames, len(SENTENCE))


async def test_utf8_pieces_count_characters_not_bytes(server) -> None:
    cfg = config(seed=5)
    cfg.sampling.max_frames = 40
    raw = SENTENCE.encode()
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, cfg)
        for i in range(0, len(raw), 5):  # splits characters across pieces
            await call.write(tts_pb2.SynthesizeRequest(
                text=tts_pb2.TextDelta(utf8=raw[i:i + 5])))
        await call.done_writing()
        resps = await drain(call)
    check_utterance(audio(resps), len(SENTENCE))
    # the first audio's timings count characters too (they counted bytes: 46 here)
    [first] = [r.event for r in resps if is_event(tts_pb2.Event.FIRST_AUDIO)(r)]
    assert 0 < first.timings.text_chars <= len(SENTENCE) < len(raw)


async def test_counts_restart_after_flush(server) -> None:
    cfg = config(seed=6)
    cfg.sampling.max_frames = 40
    second = "Second one, 你好!"
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, cfg, text(SENTENCE), FLUSH)
        first = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(text(second))
        await call.write(FLUSH)
        rest = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.done_writing()
        await drain(call)
    a, b = audio(first), audio(rest)
    assert {f.utterance_id for f in a} == {0} and {f.utterance_id for f in b} == {1}
    check_utterance(a, len(SENTENCE))
    check_utterance(b, len(second))


@pytest.mark.parametrize("per_message", [4])
async def test_a_message_says_what_its_last_frame_had_read(server, per_message: int) -> None:
    cfg = config(seed=7)
    cfg.sampling.max_frames = 30
    one = audio(await one_shot(server.addr, cfg, [SENTENCE]))
    cfg.frames_per_message = per_message
    packed = audio(await one_shot(server.addr, cfg, [SENTENCE]))
    assert any(f.frames > 1 for f in packed)
    assert [f.text_chars for f in packed] == [one[f.seq + max(f.frames, 1) - 1].text_chars
                                              for f in packed]
    check_utterance(packed, len(SENTENCE))
