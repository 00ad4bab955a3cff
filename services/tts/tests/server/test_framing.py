"""The framer (server/call/framing.py): the engine's s16 of a packet (`pcm16`), only sliced
at the native rate, gives the very frames the float path gives, for frame sizes that do and
do not divide a codec frame, with the last one zero-padded; resampled rates take the float
path."""

from __future__ import annotations

import numpy as np
import pytest
from voice_tts.engine import to_s16
from voice_tts.server.call.framing import UtteranceFramer

CODEC = 1920  # samples a codec frame at 24 kHz


def packets(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [1, 4, 4, 2, 3, 1]
    # louder than full scale in places: the clip is part of what must agree
    return [(rng.standard_normal(n * CODEC) * 0.6).astype(np.float32) for n in sizes]


def frames(framer: UtteranceFramer, pcm: list[np.ndarray], with16: bool) -> list[bytes]:
    out: list[bytes] = []
    for p in pcm:
        out += framer.push(p, to_s16(p).tobytes() if with16 else None)
    return out + framer.finish()


@pytest.mark.parametrize("frame_ms", [20, 30, 40, 100])
def test_engine_s16_is_cut_into_the_same_frames_as_the_float_path(frame_ms: int) -> None:
    pcm = packets(frame_ms)
    whole = to_s16(np.concatenate(pcm)).tobytes()
    size = 24000 * frame_ms // 1000 * 2
    expected = [whole[i:i + size] for i in range(0, len(whole), size)]
    expected[-1] += bytes(size - len(expected[-1]))  # the last, zero-padded
    got16 = frames(UtteranceFramer(24000, 24000, frame_ms), pcm, with16=True)
    got = frames(UtteranceFramer(24000, 24000, frame_ms), pcm, with16=False)
    assert got16 == got == expected
    assert all(len(f) == size for f in got16)


@pytest.mark.parametrize("rate", [16000, 48000])
def test_a_resampled_rate_ignores_the_native_s16(rate: int) -> None:
    pcm = packets(rate)
    got16 = frames(UtteranceFramer(24000, rate, 20), pcm, with16=True)
    got = frames(UtteranceFramer(24000, rate, 20), pcm, with16=False)
    assert got16 == got and len(got) >= sum(p.size for p in pcm) * rate // 24000 // (rate // 50)
    assert all(len(f) == rate // 50 * 2 for f in got)
