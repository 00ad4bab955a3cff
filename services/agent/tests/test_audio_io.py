"""The public hooks of the real-time devices (voice_agent.audio_io) that a harness such
as AutoRTC watches: the speaker's OutputTap and the microphone's delivery clock. Real
time, no session: frames are handed to the speaker as the framework would."""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest
from livekit import rtc
from voice_agent.audio_io import MicrophoneInput, OutputTap, SpeakerOutput

RATE, FRAME_MS = 24000, 20
FS = RATE * FRAME_MS // 1000


class Recorder(OutputTap):
    def __init__(self) -> None:
        self.captured_: list[tuple[float, bytes, int]] = []
        self.played_: list[tuple[float, bytes, int]] = []

    def captured(self, at: float, pcm: bytes, segment: int) -> None:
        self.captured_.append((at, pcm, segment))

    def played(self, at: float, pcm: bytes, segment: int) -> None:
        self.played_.append((at, pcm, segment))


def frame(value: int) -> rtc.AudioFrame:
    pcm = np.full(FS, value, dtype=np.int16).tobytes()
    return rtc.AudioFrame(data=pcm, sample_rate=RATE, num_channels=1, samples_per_channel=FS)


async def until_quiet(out: SpeakerOutput, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while out.playing:
            await asyncio.sleep(0.005)


async def test_tap_sees_accepted_frames_and_played_ticks_per_segment() -> None:
    tap = Recorder()
    out = SpeakerOutput(sample_rate=RATE, frame_ms=FRAME_MS, tap=tap)
    out.start()
    try:
        before = time.perf_counter()
        for v in (1, 2):
            await out.capture_frame(frame(v))
        out.flush()
        assert out.playing
        await until_quiet(out)
        # a second reply, cut by a clear before its flush: what comes after is dropped
        await out.capture_frame(frame(3))
        out.clear_buffer()
        await out.capture_frame(frame(4))  # the framework's tail after the barge-in
        out.flush()
        assert not out.playing
        await out.capture_frame(frame(5))  # the next reply
        out.flush()
        await until_quiet(out)
    finally:
        await out.aclose()
    values = [(pcm[0], seg) for _, pcm, seg in tap.captured_]
    assert values == [(1, 1), (2, 1), (3, 2), (5, 3)]
    assert all(at >= before for at, _, _ in tap.captured_)
    played = [(pcm[0], seg) for _, pcm, seg in tap.played_]
    assert (1, 1) in played and (2, 1) in played and (5, 3) in played and (4, 2) not in played
    assert b"".join(p for _, p, s in tap.played_ if s == 1) == frame(1).data.tobytes() + \
        frame(2).data.tobytes()
    audible = [t.at for t in out.ticks if t.audible]
    assert [at for at, _, _ in tap.played_] == audible  # one call per audible tick


async def test_microphone_clock_is_readable_and_matches_delivery() -> None:
    mic = MicrophoneInput(sample_rate=16000, frame_ms=20)
    assert mic.t0 is None and mic.frames_sent == 0 and mic.frame_s == 0.02
    for _ in range(3):
        await mic.__anext__()
    assert mic.t0 is not None and mic.frames_sent == 3
    speech = mic.play(np.full(160, 100, dtype=np.int16))  # 10 ms, in the next frame
    due = mic.t0 + mic.frames_sent * mic.frame_s
    await mic.__anext__()
    start, end = await speech
    assert due - 1e-6 <= start < due + 0.05  # delivered on the clock it exposes
    assert end - start == pytest.approx(160 / 16000)
    mic.close()


async def test_a_socket_speaker_starts_each_reply_at_its_first_frame_and_rests_between() -> None:
    """The socket's client plays as it receives: a reply's first frame leaves when it is
    in, not at the next 20 ms slot of a free-running grid (0-20 ms later), its next ones
    on a grid of its own, and an idle speaker does not tick at all."""
    from voice_agent.conversation.speaker import SocketSpeaker

    ticks: list[tuple[float, bool]] = []

    class Counted(SocketSpeaker):
        def _tick(self, at: float, chunk: bytes, audible: bool) -> None:
            ticks.append((at, audible))
            super()._tick(at, chunk, audible)

    sent: list[tuple[float, bool]] = []
    out = Counted(lambda pcm, first: sent.append((time.perf_counter(), first)), lambda: None,
                  sample_rate=RATE, frame_ms=FRAME_MS)
    out.start()
    firsts = []
    try:
        await asyncio.sleep(0.1)
        assert ticks == []  # nothing to play: no ticks
        for k in range(5):
            await asyncio.sleep(0.007 * k)  # replies at different phases of any grid
            firsts.append(time.perf_counter())
            for v in (1, 2, 3):
                await out.capture_frame(frame(v))
            out.flush()
            await until_quiet(out)
            n = len(ticks)
            await asyncio.sleep(0.06)
            assert len(ticks) == n  # idle again
    finally:
        await out.aclose()
    starts = [at for at, first in sent if first]
    assert len(starts) == 5 and len(sent) == 15
    late = [round((s - c) * 1e3, 1) for s, c in zip(starts, firsts, strict=True)]
    assert max(late) < 8, f"first frames left {late} ms after they came in"
    for r in range(5):  # each reply's frames 20 ms apart, from its first
        at = [t for t, _ in sent[3 * r:3 * r + 3]]
        assert all(0.015 < b - a < 0.03 for a, b in itertools.pairwise(at)), at
