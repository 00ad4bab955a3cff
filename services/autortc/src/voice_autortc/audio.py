"""PCM in and out: mono WAV files, int16 <-> float, resampling, 20 ms framing.

Every signal inside AutoRTC is mono float32 in [-1, 1] at a stated sample rate; files
on disk are 16-bit PCM WAV (what the bots publish and record). Resampling is linear
interpolation: it is used for the user's input (espeak-ng writes 22.05 kHz) and for
the speed-drift fault, never on the path a metric compares pre vs post.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

FULL_SCALE = 32768.0


def to_float(pcm: bytes | np.ndarray) -> np.ndarray:
    """int16 PCM (bytes or array) -> float32 in [-1, 1)."""
    a = np.frombuffer(pcm, dtype=np.int16) if isinstance(pcm, bytes | bytearray) else pcm
    return (np.asarray(a, dtype=np.float32) / FULL_SCALE).astype(np.float32)


def to_int16(x: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16, saturating (a clipped sample stays at full scale)."""
    return np.clip(np.round(x * FULL_SCALE), -32768, 32767).astype(np.int16)


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """A mono 16-bit WAV -> (float32 samples, sample rate); stereo is averaged."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as w:
            if w.getsampwidth() != 2:
                raise ValueError(f"{path}: need 16-bit PCM, got {8 * w.getsampwidth()}-bit")
            rate, channels = w.getframerate(), w.getnchannels()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise ValueError(f"{path}: not a PCM WAV file ({e})") from None
    x = to_float(raw)
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1).astype(np.float32)
    return x, rate


def write_wav(path: str | Path, x: np.ndarray, rate: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(to_int16(np.asarray(x, dtype=np.float32)).tobytes())
    return path


def resample(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Linear-interpolation resampling (enough for test inputs and the drift fault)."""
    if src_rate == dst_rate or len(x) == 0:
        return np.asarray(x, dtype=np.float32)
    n_out = max(1, round(len(x) * dst_rate / src_rate))
    t_out = np.arange(n_out) * (src_rate / dst_rate)
    return np.interp(t_out, np.arange(len(x)), x).astype(np.float32)


def frames(x: np.ndarray, rate: int, frame_ms: int = 20) -> list[np.ndarray]:
    """Cut into frame_ms frames, the last one zero-padded (the bots publish whole frames)."""
    n = rate * frame_ms // 1000
    pad = (-len(x)) % n
    x = np.concatenate([x, np.zeros(pad, dtype=np.float32)]) if pad else x
    return [x[i : i + n] for i in range(0, len(x), n)]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def dbfs(value: float) -> float:
    return float(20.0 * np.log10(max(value, 1e-9)))
