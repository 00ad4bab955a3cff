"""Audio parts as the contract allows them: 16 kHz mono 16-bit PCM, raw or in a WAV file.

Anything else is rejected with a message that says what was found and what is expected;
there is no resampling here on purpose (the agent already has 16 kHz from its VAD, and a
silent resample would hide a client bug).
"""

from __future__ import annotations

import io
import wave

import numpy as np

from voice_llm.chat import SAMPLE_RATE, AudioClip
from voice_llm.errors import InvalidInput

PCM = "pcm_s16le"
WAV = "wav"


def decode_audio(data: bytes, fmt: str, sample_rate: int, where: str) -> AudioClip:
    """Decodes one audio part; `where` names it in error messages (e.g. messages[1].parts[0])."""
    if not data:
        raise InvalidInput(f"{where}: audio part has no data")
    if fmt == PCM:
        if sample_rate != SAMPLE_RATE:
            raise InvalidInput(
                f"{where}: sample_rate is {sample_rate}, the thinker takes {SAMPLE_RATE} Hz "
                "PCM only (resample on the client)"
            )
        if len(data) % 2:
            raise InvalidInput(f"{where}: PCM s16le data has an odd byte count ({len(data)})")
        pcm = data
    elif fmt == WAV:
        pcm = _wav_frames(data, sample_rate, where)
    else:
        raise InvalidInput(f"{where}: audio format must be PCM_S16LE or WAV, got {fmt}")
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    if samples.size == 0:
        raise InvalidInput(f"{where}: audio part has no samples")
    return AudioClip(samples)


def _wav_frames(data: bytes, sample_rate: int, where: str) -> bytes:
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise InvalidInput(
            f"{where}: not a readable PCM WAV file ({e}); send mono 16-bit 16 kHz WAV or raw "
            "PCM_S16LE"
        ) from None
    problems = []
    if channels != 1:
        problems.append(f"{channels} channels (need mono)")
    if width != 2:
        problems.append(f"{8 * width}-bit samples (need 16-bit)")
    if rate != SAMPLE_RATE:
        problems.append(f"{rate} Hz (need {SAMPLE_RATE})")
    if sample_rate not in (0, rate):
        problems.append(f"sample_rate field {sample_rate} disagrees with the header's {rate}")
    if problems:
        raise InvalidInput(f"{where}: unsupported WAV: " + ", ".join(problems))
    return frames


def encode_wav(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """Float32 mono -> 16-bit WAV bytes (clients and tests)."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)
    return buf.getvalue()
