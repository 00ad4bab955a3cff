"""Reference audio for a cloned voice, as clients send it: decoded and checked.

A WAV file (PCM 8/16/24/32-bit or IEEE float 32/64, plain or extensible; a streamed
file's unknown data size reads to the end) or raw little-endian PCM (`pcm_s16le`,
`pcm_f32le`) with its rate and channels; any rate 8-192 kHz; channels averaged. The
engine resamples to 24 kHz. Refused (`AudioError`, a message that says what to fix): not
audio, a WAV of over `MAX_WAV_CHUNKS` chunks before its data, under 3 s or over 30 s,
silent, not finite. Decoding is CPU work: the library runs it in a worker thread, never on
the event loop that paces every stream. Clipped audio is kept with a warning
(`check_audio`): the clone copies the distortion, the user decides.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MIN_SECONDS, MAX_SECONDS = 3.0, 30.0
# Silent: RMS under -60 dBFS. Clipped: this share of samples at |x| >= CLIP_LEVEL.
SILENT_RMS = 1e-3
CLIP_LEVEL, CLIP_SHARE = 0.999, 0.01
# A recorder writes a handful of chunks (fmt, fact, LIST, bext, cue, data); a file of
# millions of empty ones is a way to make the server walk them (issue 51: 2 M `junk`
# chunks in 16 MiB took 2 s). Past this many before `data`, the file is refused.
MAX_WAV_CHUNKS = 64
RAW_FORMATS = {"pcm_s16le": np.dtype("<i2"), "pcm_f32le": np.dtype("<f4")}
FORMATS = ("wav", *RAW_FORMATS)


class AudioError(ValueError):
    """Bytes that cannot be reference audio (the message says why)."""


@dataclass(frozen=True)
class ReferenceAudio:
    """Reference audio as a client sends it: a WAV file, or raw little-endian PCM
    (`pcm_s16le` / `pcm_f32le`) with its rate and channel count."""

    data: bytes
    format: str = "wav"
    sample_rate: int = 0  # raw PCM only
    channels: int = 1  # raw PCM only


def decode_audio(ref: ReferenceAudio) -> tuple[np.ndarray, int]:
    """-> (mono float32 in [-1, 1], rate). Stereo (or more) is averaged. AudioError
    when the bytes are not audio of a supported kind."""
    if ref.format not in FORMATS:
        raise AudioError(f"unknown audio format {ref.format[:32]!r}; use one of "
                         f"{list(FORMATS)}")
    if ref.format == "wav":
        return _decode_wav(ref.data)
    if not 8000 <= ref.sample_rate <= 192000:
        raise AudioError(f"raw PCM needs its sample_rate (8000..192000 Hz), got "
                         f"{ref.sample_rate}")
    if not 1 <= ref.channels <= 8:
        raise AudioError(f"channels must be 1..8, got {ref.channels}")
    dtype = RAW_FORMATS[ref.format]
    frame = dtype.itemsize * ref.channels
    if len(ref.data) % frame:
        raise AudioError(f"{ref.format} data of {len(ref.data)} bytes is not a "
                         f"whole number of {ref.channels}-channel samples")
    samples = np.frombuffer(ref.data, dtype).reshape(-1, ref.channels)
    return _mono(samples), ref.sample_rate


def _decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A RIFF/WAVE file: PCM 8/16/24/32-bit or IEEE float 32/64, plain or extensible; a
    streamed file's unknown data size (0xFFFFFFFF) reads to the end."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("audio_sample is not a WAV file (no RIFF/WAVE header); "
                         "send WAV, or raw PCM with its format and sample_rate")
    pos, fmt, payload, chunks = 12, None, None, 0
    while pos + 8 <= len(data):
        chunks += 1
        if chunks > MAX_WAV_CHUNKS:
            raise AudioError(f"WAV file with over {MAX_WAV_CHUNKS} chunks before its data "
                             "chunk; save it again as a plain WAV (fmt, then data)")
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        body = data[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = body
        elif cid == b"data":
            payload = body  # a streamed size (0xFFFFFFFF) takes what is there
            break
        pos += 8 + size + (size & 1)
    if fmt is None or len(fmt) < 16 or payload is None:
        raise AudioError("WAV file without a fmt and a data chunk")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == 0xFFFE and len(fmt) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the subformat's tag
        tag = struct.unpack("<H", fmt[24:26])[0]
    kinds = {(1, 8): np.dtype("u1"), (1, 16): np.dtype("<i2"), (1, 32): np.dtype("<i4"),
             (3, 32): np.dtype("<f4"), (3, 64): np.dtype("<f8")}
    if channels < 1 or not 8000 <= rate <= 192000:
        raise AudioError(f"WAV with {channels} channels at {rate} Hz; need 1+ "
                         "channels at 8000..192000 Hz")
    width = bits // 8
    payload = payload[:len(payload) - len(payload) % (width * channels or 1)]
    if (tag, bits) == (1, 24):
        raw = np.frombuffer(payload, np.uint8).reshape(-1, 3)
        ints = (raw[:, 0].astype(np.int32) | raw[:, 1].astype(np.int32) << 8
                | raw[:, 2].astype(np.int8).astype(np.int32) << 16)
        return _mono((ints / float(1 << 23)).astype(np.float32).reshape(-1, channels)), rate
    if (tag, bits) not in kinds:
        raise AudioError(f"WAV encoding (format {tag}, {bits} bits) is not "
                         "supported; use PCM 8/16/24/32-bit or float 32/64")
    samples = np.frombuffer(payload, kinds[tag, bits]).reshape(-1, channels)
    return _mono(samples), rate


def _mono(samples: np.ndarray) -> np.ndarray:
    """(n, channels) of any sample type -> (n,) float32 in [-1, 1], channels averaged."""
    if samples.dtype == np.uint8:
        x = (samples.astype(np.float32) - 128.0) / 128.0
    elif samples.dtype.kind == "i":
        x = samples.astype(np.float32) / float(np.iinfo(samples.dtype).max + 1)
    else:
        x = samples.astype(np.float32)
    return x.mean(axis=1) if x.shape[1] > 1 else x[:, 0].copy()


def check_audio(audio: np.ndarray, rate: int) -> list[str]:
    """Refuses what cannot make a voice (AudioError); returns warnings."""
    seconds = len(audio) / rate
    if not np.isfinite(audio).all():
        raise AudioError("the audio holds NaN or infinite samples")
    if seconds < MIN_SECONDS or seconds > MAX_SECONDS:
        raise AudioError(f"the reference audio is {seconds:.2f} s; it must be "
                         f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s of speech")
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    if rms < SILENT_RMS:
        raise AudioError(f"the reference audio is silent (RMS {rms:.1e}, under "
                         f"{SILENT_RMS:g}); record the speaker louder")
    clipped = float(np.mean(np.abs(audio) >= CLIP_LEVEL))
    if clipped > CLIP_SHARE:
        return [f"clipped: {100 * clipped:.1f}% of the samples are at full scale; the "
                "voice copies the distortion (record again, quieter, if it matters)"]
    return []
