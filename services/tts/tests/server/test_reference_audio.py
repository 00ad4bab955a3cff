"""Reference audio decoding (server/reference_audio.py), without a server: every WAV
encoding a recorder writes gives the same samples, and bad bytes a clear AudioError."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from voice_tts.server.voices.reference_audio import (
    AudioError,
    ReferenceAudio,
    check_audio,
    decode_audio,
)

RATE = 22050
X = (0.4 * np.sin(2 * np.pi * 200 * np.arange(RATE * 4) / RATE)).astype(np.float32)


def riff(tag: int, bits: int, data: bytes, channels: int = 1, extensible: bool = False,
         streamed: bool = False) -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, RATE,
                      RATE * block, block, bits)
    if extensible:  # cbSize, valid bits, channel mask, subformat GUID (tag first)
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", tag) + b"\0" * 14
    size = 0xFFFFFFFF if streamed else len(data)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"LIST" + struct.pack("<I", 4) + b"INFO"  # a chunk readers skip
            + b"data" + struct.pack("<I", size) + data)
    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF if streamed else len(body)) + body


def s24(x: np.ndarray) -> bytes:
    v = np.round(x * (2**23 - 1)).astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]
    return v.tobytes()


CASES = {
    "pcm16": (riff(1, 16, (X * 32767).astype("<i2").tobytes()), 1e-4),
    "pcm24": (riff(1, 24, s24(X)), 1e-6),
    "pcm32": (riff(1, 32, np.round(X * (2**31 - 1)).astype("<i4").tobytes()), 1e-6),
    "u8": (riff(1, 8, np.round(X * 127 + 128).astype(np.uint8).tobytes()), 1e-2),
    "float32": (riff(3, 32, X.astype("<f4").tobytes()), 0),
    "float64": (riff(3, 64, X.astype("<f8").tobytes()), 1e-7),
    "extensible pcm16": (riff(1, 16, (X * 32767).astype("<i2").tobytes(), extensible=True),
                         1e-4),
    "streamed (size unknown)": (riff(1, 16, (X * 32767).astype("<i2").tobytes(),
                                     streamed=True), 1e-4),
    "stereo, averaged": (riff(1, 16, (np.stack([X, X], 1) * 32767).astype("<i2").tobytes(),
                              channels=2), 1e-4),
}


@pytest.mark.parametrize("name", CASES)
def test_every_wav_encoding_gives_the_samples(name: str) -> None:
    data, tol = CASES[name]
    audio, rate = decode_audio(ReferenceAudio(data))
    assert rate == RATE and audio.dtype == np.float32 and len(audio) == len(X)
    np.testing.assert_allclose(audio, X, atol=tol)
    assert check_audio(audio, rate) == []


def test_raw_pcm_channels_are_averaged() -> None:
    stereo = np.stack([X, -X * 0.5], 1).astype("<f4").tobytes()
    audio, rate = decode_audio(ReferenceAudio(stereo, "pcm_f32le", 48000, 2))
    assert rate == 48000
    np.testing.assert_allclose(audio, X * 0.25, atol=1e-7)


@pytest.mark.parametrize("data,message", [
    (b"", "not a WAV"),
    (b"RIFF\0\0\0\0WAVE", "without a fmt and a data chunk"),
    (riff(2, 4, b"\0" * 100), "not supported"),  # ADPCM
    (riff(1, 16, b"")[:-8] + b"junk", "without a fmt and a data chunk"),
    # a chunk bomb (issue 51): empty chunks before data, the walk capped
    (riff(1, 16, b"").replace(b"data", b"junk\0\0\0\0" * 65 + b"data"), "over 64 chunks"),
])
def test_bad_wav_says_why(data: bytes, message: str) -> None:
    with pytest.raises(AudioError, match=message):
        decode_audio(ReferenceAudio(data))


def test_clipping_warns_and_silence_refuses() -> None:
    assert "clipped" in check_audio(np.clip(X * 10, -1, 1), RATE)[0]
    with pytest.raises(AudioError, match="silent"):
        check_audio(X * 1e-4, RATE)
    with pytest.raises(AudioError, match="3 to 30 s"):
        check_audio(X[:RATE], RATE)


async def test_a_decode_past_its_time_is_refused_at_once_and_keeps_its_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for a decode is capped (DECODE_TIMEOUT_S): a 400 at once, while the slow
    thread keeps its decoder slot until it ends (the cap on decodes at once holds)."""
    import asyncio
    import time

    from voice_tts.engine import Engine, EngineSettings
    from voice_tts.server.errors import VoiceError
    from voice_tts.server.voices import voice_library as vl

    def slow_decode(ref: ReferenceAudio) -> tuple[np.ndarray, int]:
        time.sleep(0.6)
        return np.zeros(16000 * 4, np.float32), 16000

    monkeypatch.setattr(vl, "decode_audio", slow_decode)
    monkeypatch.setattr(vl, "DECODE_TIMEOUT_S", 0.1)
    engine = Engine.from_preset("tiny-base", settings=EngineSettings(max_sessions=1))
    lib = vl.VoiceLibrary(engine, None, max_upload_bytes=1 << 20)
    t0 = time.perf_counter()
    with pytest.raises(VoiceError, match=r"took over 0\.1 s"):
        await lib.inline_prompt(ReferenceAudio(b"RIFF"))
    assert time.perf_counter() - t0 < 0.4  # not the decode's 0.6 s
    assert lib._decoders._value == vl.DECODERS - 1  # the thread still holds its slot
    await asyncio.sleep(0.8)
    assert lib._decoders._value == vl.DECODERS
