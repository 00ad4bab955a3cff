"""The batched Silero VAD (vad_batch.py) decides as the plugin's one stream at a time does:
real espeak-ng speech through several concurrent streams of one process (different
offsets, options and frame sizes) gives each stream the probabilities and START/END
events it gets alone; a stream closed mid-batch, a paused stream and a failed ONNX run
hold nobody up, and one stream's options are its own.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from livekit import rtc
from livekit.agents import vad
from livekit.plugins import silero
from voice_agent.conversation.parts import load_vad
from voice_agent.settings import AgentSettings
from voice_agent.vad_batch import MAX_WAIT_S, BatchedVAD

from .backends import espeak

TEXTS = ("What is the weather like today?", "Book a table for two, please.",
         "And tomorrow?", "I would like to hear some music.")
_S = AgentSettings()
BASE = {"min_speech_duration": _S.vad_min_speech_ms / 1000,  # the agent's (load_vad's)
        "min_silence_duration": _S.vad_silence_ms / 1000,
        "activation_threshold": _S.vad_activation_threshold, "sample_rate": 16000}


@dataclass(frozen=True)
class Case:
    lead_ms: int  # silence before the speech: each stream's windows at their own phase
    frame_ms: int
    options: tuple[tuple[str, float], ...] = ()


CASES = (Case(0, 20), Case(130, 10, (("activation_threshold", 0.6),)),
         Case(250, 20, (("min_silence_duration", 0.5), ("min_speech_duration", 0.1))),
         Case(410, 30, (("activation_threshold", 0.35), ("min_silence_duration", 0.1))))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp = tmp_path_factory.mktemp("espeak")
    pause = np.zeros(16000, np.int16)
    return [np.concatenate([espeak(t, tmp), pause]) for t in TEXTS]


def frames(pcm: np.ndarray, case: Case) -> list[rtc.AudioFrame]:
    x = np.concatenate([np.zeros(case.lead_ms * 16, np.int16), pcm])
    n = case.frame_ms * 16
    return [rtc.AudioFrame(x[k:k + n].tobytes(), 16000, 1, n) for k in range(0, len(x) - n + 1, n)]


async def decide(stream: Any, audio: list[rtc.AudioFrame], pace_s: float = 0.0,
                 options: tuple[tuple[str, float], ...] = ()) -> list[vad.VADEvent]:
    """Push the frames (`pace_s` apart; 0: at once) and read every event to the end."""
    if options:
        getattr(stream, "inner", stream).update_options(**dict(options))

    async def push() -> None:
        for f in audio:
            stream.push_frame(f)
            if pace_s:
                await asyncio.sleep(pace_s)
        stream.end_input()

    pushing = asyncio.create_task(push())
    events = [ev async for ev in stream]
    await pushing
    await stream.aclose()
    return events


def alone(pcm: np.ndarray, case: Case) -> list[vad.VADEvent]:
    """The plugin's own stream, the only one of its VAD (the reference)."""
    async def run() -> list[vad.VADEvent]:
        plain = silero.VAD.load(**BASE)
        return await decide(plain.stream(), frames(pcm, case), options=case.options)
    return asyncio.run(run())


def assert_same(got: list[vad.VADEvent], want: list[vad.VADEvent]) -> None:
    def key(evs: list[vad.VADEvent]) -> list[tuple[str, int]]:
        return [(ev.type.value, ev.samples_index) for ev in evs]
    assert key(got) == key(want)
    kinds = {ev.type for ev in want}
    assert {vad.VADEventType.START_OF_SPEECH, vad.VADEventType.END_OF_SPEECH} <= kinds
    probs = [(g.probability, w.probability) for g, w in zip(got, want, strict=True)
             if w.type == vad.VADEventType.INFERENCE_DONE]
    np.testing.assert_allclose(*zip(*probs, strict=True), atol=1e-5)


def batched() -> tuple[BatchedVAD, list[int]]:
    """A fresh BatchedVAD with the agent's defaults, and the sizes of the batches it runs."""
    v = BatchedVAD.load(**BASE)
    assert isinstance(v, BatchedVAD)
    sizes: list[int] = []
    run = v.batch.run

    def counted(windows: list[Any]) -> np.ndarray:
        sizes.append(len(windows))
        return run(windows)

    v.batch.run = counted  # type: ignore[method-assign]
    return v, sizes


async def test_concurrent_streams_decide_as_each_alone(speech: list[np.ndarray]) -> None:
    want = [await asyncio.to_thread(alone, pcm, c) for pcm, c in zip(speech, CASES, strict=True)]
    v, sizes = batched()
    # paced (2 ms a frame: ~10x real time) so that the streams interleave window by window
    got = await asyncio.gather(*(decide(v.stream(), frames(pcm, c), 0.002, c.options)
                                 for pcm, c in zip(speech, CASES, strict=True)))
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert max(sizes) == len(CASES), sizes  # windows of every stream in one call
    assert sum(sizes) == sum(ev.type == vad.VADEventType.INFERENCE_DONE
                             for evs in want for ev in evs)


async def test_the_agents_vad_is_batched_and_at_once_is_as_alone(
        speech: list[np.ndarray]) -> None:
    """load_vad's VAD (every door's) through TimedVAD, the clips pushed at once."""
    from voice_agent.speech_end import TimedVAD

    agent_vad = load_vad(AgentSettings())
    assert isinstance(agent_vad, BatchedVAD)
    # Silero's own ends (the end the stream says sooner: test_speech_end.py)
    timed = TimedVAD(agent_vad, lambda _: None, early_end=False)
    want = [await asyncio.to_thread(alone, pcm, CASES[0]) for pcm in speech[:3]]
    got = await asyncio.gather(*(decide(timed.stream(), frames(pcm, CASES[0]))
                                 for pcm in speech[:3]))
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


async def test_one_streams_options_are_its_own(speech: list[np.ndarray]) -> None:
    v, _ = batched()
    tuned, plain = v.stream(), v.stream()
    tuned.update_options(activation_threshold=0.8, min_silence_duration=0.2)
    assert (plain._opts.activation_threshold, plain._opts.min_silence_duration) == (
        BASE["activation_threshold"], BASE["min_silence_duration"])
    assert v.min_silence_duration == BASE["min_silence_duration"]
    case = Case(0, 20, (("activation_threshold", 0.8), ("min_silence_duration", 0.2)))
    got = await asyncio.gather(decide(tuned, frames(speech[0], case), 0.002),
                               decide(plain, frames(speech[0], CASES[0]), 0.002))
    assert_same(got[0], await asyncio.to_thread(alone, speech[0], case))
    assert_same(got[1], await asyncio.to_thread(alone, speech[0], CASES[0]))


async def test_a_stream_closed_mid_batch_holds_nobody(speech: list[np.ndarray]) -> None:
    v, sizes = batched()
    run, gate, held = v.batch.run, threading.Event(), threading.Event()

    def slow(windows: list[Any]) -> np.ndarray:
        if len(sizes) == 6:  # the 6th batch waits until a stream has closed
            held.set()
            gate.wait(10)
        return run(windows)

    v.batch.run = slow  # type: ignore[method-assign]
    closing = v.stream()
    for f in frames(speech[1], CASES[0]):
        closing.push_frame(f)
    others = asyncio.gather(*(decide(v.stream(), frames(pcm, c), 0.002)
                              for pcm, c in ((speech[0], CASES[0]), (speech[2], CASES[0]))))
    await asyncio.to_thread(held.wait, 10)
    await closing.aclose()  # its window is in the held batch
    gate.set()
    got = await asyncio.wait_for(others, 30)
    assert_same(got[0], await asyncio.to_thread(alone, speech[0], CASES[0]))
    assert_same(got[1], await asyncio.to_thread(alone, speech[2], CASES[0]))


async def test_a_paused_stream_delays_others_by_at_most_the_wait(
        speech: list[np.ndarray]) -> None:
    """A stream that stops sending (not closed) is waited for MAX_WAIT_S at most, and not
    at all once it has been silent two hops: a live stream's windows are not held."""
    v, _ = batched()
    paused = v.stream()
    for f in frames(speech[0], CASES[0])[:20]:  # 0.4 s, then nothing
        paused.push_frame(f)
    await asyncio.sleep(0.3)
    live, loop = v.stream(), asyncio.get_running_loop()
    pushed: list[float] = []

    async def push() -> None:
        for f in frames(speech[1], CASES[0])[:50]:  # 1 s in real time
            live.push_frame(f)
            pushed.append(loop.time())
            await asyncio.sleep(0.02)
        live.end_input()

    pushing, delays = asyncio.create_task(push()), []
    async for ev in live:
        if ev.type == vad.VADEventType.INFERENCE_DONE:  # its window's last frame -> now
            delays.append(loop.time() - pushed[-(-ev.samples_index // 320) - 1])
            if len(delays) == 20:
                waited_for = list(v.batch.hop().members)
    await pushing
    assert len(delays) == 50 * 320 // 512
    assert waited_for == [live._model]  # not the paused stream
    # ~1 ms here (a window held for the paused stream: MAX_WAIT_S); loose for a busy host
    assert np.median(delays) <= MAX_WAIT_S + 0.04, delays
    await paused.aclose()
    await live.aclose()


async def test_a_failed_run_ends_every_stream_of_its_batch_with_the_error(
        speech: list[np.ndarray]) -> None:
    v, _ = batched()

    def broken(windows: list[Any]) -> np.ndarray:
        raise RuntimeError("onnx says no")

    v.batch.run = broken  # type: ignore[method-assign]
    streams = [v.stream() for _ in range(3)]
    for s in streams:
        for f in frames(speech[0], CASES[0])[:10]:
            s.push_frame(f)

    async def read(s: Any) -> None:
        async for _ in s:
            pass

    for s in streams:
        with pytest.raises(RuntimeError, match="onnx says no"):
            await asyncio.wait_for(read(s), 10)
        await s.aclose()
