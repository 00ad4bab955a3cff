"""The streaming rules of Synthesize over a real server: FLUSH, STOP, RESET, half-close,
contiguous seq, exact frame sizes, events in order, concurrent sessions."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from voice.tts.v1 import tts_pb2, tts_pb2_grpc

from .conftest import config

TEXT = "Hello there, streaming world."
FLUSH = tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.FLUSH))
STOP = tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.STOP))
RESET = tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=tts_pb2.Control.RESET))


def text(t: str) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=t))


async def open_call(ch: grpc.aio.Channel, cfg: tts_pb2.SessionConfig,
                    *requests: tts_pb2.SynthesizeRequest) -> grpc.aio.StreamStreamCall:
    """A Synthesize call that has sent its config, then `requests` in order."""
    call = tts_pb2_grpc.TextToSpeechStub(ch).Synthesize()
    await call.write(tts_pb2.SynthesizeRequest(config=cfg))
    for r in requests:
        await call.write(r)
    return call


def kinds(resps: list[tts_pb2.SynthesizeResponse]) -> list[str]:
    out = []
    for r in resps:
        if r.WhichOneof("response") == "audio":
            out.append("A")
        else:
            out.append(tts_pb2.Event.Type.Name(r.event.type))
    return out


async def read_until(call, pred) -> list[tts_pb2.SynthesizeResponse]:
    got = []
    while True:
        r = await asyncio.wait_for(call.read(), 60)
        assert r is not grpc.aio.EOF, f"stream ended early after {kinds(got)}"
        got.append(r)
        if pred(r):
            return got


def is_event(kind: int):
    return lambda r: r.WhichOneof("response") == "event" and r.event.type == kind


async def drain(call) -> list[tts_pb2.SynthesizeResponse]:
    got = []
    while (r := await asyncio.wait_for(call.read(), 120)) is not grpc.aio.EOF:
        got.append(r)
    return got


def audio(resps) -> list[tts_pb2.AudioFrame]:
    return [r.audio for r in resps if r.WhichOneof("response") == "audio"]


async def one_shot(addr: str, cfg: tts_pb2.SessionConfig, pieces: list[str]) -> list:
    async with grpc.aio.insecure_channel(addr) as ch:
        call = await open_call(ch, cfg)
        for p in pieces:
            await call.write(text(p))
        await call.done_writing()
        return await drain(call)


async def test_half_close_speaks_everything_then_ends(server) -> None:
    resps = await one_shot(server.addr, config(), [TEXT[:7], TEXT[7:]])
    k = kinds(resps)
    assert k[0] == "SESSION_STARTED" and k[1] == "FIRST_AUDIO" and k[-1] == "FLUSHED"
    # Random weights rarely reach codec EOS: the 12-frame cap ends it (TRUNCATED).
    assert k[-2] == "TRUNCATED" and set(k[2:-2]) == {"A"}, k
    started = resps[0].event.config
    assert (started.sample_rate, started.frame_ms, started.voice) == (24000, 20, "vivian")
    assert started.session_id and started.language == "auto"
    frames = audio(resps)
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [f.start_ms for f in frames] == [20 * i for i in range(len(frames))]
    assert all(len(f.pcm) == 480 * 2 for f in frames)
    assert [f.last_in_utterance for f in frames].count(True) == 1 and frames[-1].last_in_utterance
    # 12 codec frames of 80 ms = 960 ms = 48 frames of 20 ms.
    assert len(frames) == 48
    first = resps[1].event
    assert first.timings.ttfa_ms > 0 and first.next_seq == 0 and first.timings.text_chars > 0


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
@pytest.mark.parametrize("frame_ms", [10, 20, 40])
async def test_exact_frame_sizes(server, rate: int, frame_ms: int) -> None:
    cfg = config(sample_rate=rate, frame_ms=frame_ms)
    cfg.sampling.max_frames = 3
    frames = audio(await one_shot(server.addr, cfg, ["Hi there."]))
    want = rate * frame_ms // 1000 * 2
    assert frames and all(len(f.pcm) == want for f in frames)
    assert [f.seq for f in frames] == list(range(len(frames)))
    # 3 codec frames = 240 ms; the last frame is zero-padded, resampling may add a frame.
    assert 240 // frame_ms <= len(frames) <= 240 // frame_ms + 2


async def test_flush_keeps_session_open_and_starts_new_utterance(server) -> None:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, config(), text("First one."), FLUSH)
        first = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(text("Second one."))
        await call.write(FLUSH)
        second = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.done_writing()
        rest = await drain(call)
    a1, a2 = audio(first), audio(second)
    assert a1 and a2 and not audio(rest)
    assert {f.utterance_id for f in a1} == {0} and {f.utterance_id for f in a2} == {1}
    assert [f.seq for f in a1 + a2] == list(range(len(a1) + len(a2)))
    assert kinds(second)[0] == "FIRST_AUDIO"
    assert second[-1].event.next_seq == len(a1) + len(a2)


async def test_stop_sends_no_frame_after_stopped(server) -> None:
    cfg = config()
    cfg.sampling.max_frames = 60  # long enough to still be speaking at STOP
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, cfg, text(TEXT * 3), FLUSH)
        before = await read_until(call, lambda r: r.WhichOneof("response") == "audio")
        await call.write(STOP)
        upto = await read_until(call, is_event(tts_pb2.Event.STOPPED))
        # After STOPPED nothing of utterance 0 may come: speak again and look.
        await call.write(text("Again."))
        await call.done_writing()
        after = await drain(call)
    stopped = upto[-1].event
    old = audio(before + upto)
    assert all(f.utterance_id == 0 for f in old)
    assert len(old) < 60 * 4, "STOP must cut the utterance short"
    assert stopped.utterance_id == 0 and stopped.next_seq == len(old)  # the one it stopped
    new = audio(after)
    assert new and all(f.utterance_id == 1 for f in new)
    assert [f.seq for f in old + new] == list(range(len(old) + len(new)))
    assert kinds(after)[-1] == "FLUSHED"


async def test_reset_restarts_like_a_new_session(server) -> None:
    cfg = config()
    cfg.sampling.greedy = False  # sampled: only the re-seeded generator repeats itself
    cfg.sampling.max_frames = 6
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, cfg, text(TEXT), FLUSH)
        first = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(RESET)
        reset = await read_until(call, is_event(tts_pb2.Event.RESET))
        await call.write(text(TEXT))
        await call.done_writing()
        second = await drain(call)
    assert not audio(reset)
    pcm1 = b"".join(f.pcm for f in audio(first))
    pcm2 = b"".join(f.pcm for f in audio(second))
    assert pcm1 and pcm1 == pcm2


async def test_empty_and_whitespace_flush_answer_at_once(server) -> None:
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, config(), FLUSH)
        a = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.write(text("   \n "))
        await call.write(FLUSH)
        b = await read_until(call, is_event(tts_pb2.Event.FLUSHED))
        await call.done_writing()
        rest = await drain(call)
    assert kinds(a) == ["SESSION_STARTED", "FLUSHED"]
    assert kinds(b) == ["FLUSHED"] and not audio(rest)


async def test_utf8_bytes_split_mid_character_equal_whole_text(server) -> None:
    whole = "你好，世界。Hello!"
    raw = whole.encode()
    pieces = [raw[i : i + 2] for i in range(0, len(raw), 2)]  # splits every CJK character
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, config())
        for p in pieces:
            await call.write(tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(utf8=p)))
        await call.done_writing()
        split = audio(await drain(call))
    solo = audio(await one_shot(server.addr, config(), [whole]))
    assert b"".join(f.pcm for f in split) == b"".join(f.pcm for f in solo)


async def test_eight_interleaved_sessions_each_equal_their_solo_run(server) -> None:
    texts = [f"Session number {i} says hello." for i in range(8)]
    cfgs = [config(seed=100 + i) for i in range(8)]
    for c in cfgs:
        c.sampling.greedy = False  # sampled, seeded: interleaving must not mix generators
        c.sampling.max_frames = 8
    solo = [b"".join(f.pcm for f in audio(await one_shot(server.addr, c, [t])))
            for c, t in zip(cfgs, texts, strict=True)]

    async def interleaved(i: int) -> bytes:
        words = texts[i].split(" ")
        async with grpc.aio.insecure_channel(server.addr) as ch:
            call = await open_call(ch, cfgs[i])
            for w in words:
                await call.write(text(w + " " if w != words[-1] else w))
                await asyncio.sleep(0.003 * (i % 3))
            await call.done_writing()
            return b"".join(f.pcm for f in audio(await drain(call)))

    together = await asyncio.gather(*(interleaved(i) for i in range(8)))
    assert all(s for s in solo)
    for i in range(8):
        # Same codes, so the same audio up to the float rounding of a batched decoder (a
        # different code would change whole frames, by far more than 4 LSB).
        a, b = (np.frombuffer(x, dtype="<i2").astype(int) for x in (together[i], solo[i]))
        assert len(a) == len(b), f"session {i}: {len(a)} vs {len(b)} samples"
        assert np.abs(a - b).max() <= 4, f"session {i} differs from its solo run"
    assert len(set(solo)) == 8, "different seeds and texts should give different audio"


@pytest.mark.parametrize("per_message", [3, 4, 16])
async def test_frames_per_message_packs_the_same_audio(server, per_message: int) -> None:
    """frames_per_message n: fewer messages, the same bytes (same seed), seq and start_ms
    counting frames, `frames` telling how many each holds, one last_in_utterance."""
    cfg = config(seed=11)
    cfg.sampling.max_frames = 9
    one = audio(await one_shot(server.addr, cfg, [TEXT]))
    cfg.frames_per_message = per_message
    resps = await one_shot(server.addr, cfg, [TEXT])
    assert resps[0].event.config.frames_per_message == per_message
    packed = audio(resps)
    assert b"".join(f.pcm for f in packed) == b"".join(f.pcm for f in one)
    assert len(packed) < len(one) and all(1 <= f.frames <= per_message for f in packed)
    assert all(len(f.pcm) == f.frames * 480 * 2 for f in packed)
    seqs = [0]
    for f in packed[:-1]:
        seqs.append(seqs[-1] + f.frames)
    assert [f.seq for f in packed] == seqs and [f.start_ms for f in packed] == [
        20 * s for s in seqs]
    assert [f.last_in_utterance for f in packed] == [False] * (len(packed) - 1) + [True]
    # A packet's frames are not held for the next one, but for its newest (until the next
    # packet shows it was not the last): the first 80 ms is one message of 60 ms.
    assert packed[0].frames == min(3, per_message)


async def test_frames_per_message_over_the_limit_is_refused(server) -> None:
    cfg = config()
    cfg.frames_per_message = 17
    async with grpc.aio.insecure_channel(server.addr) as ch:
        call = await open_call(ch, cfg)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await drain(call)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frames_per_message" in (e.value.details() or "")
