"""Audio as JSON events carry it (`decode` / `encode`): base64 of pcm16 at 24 kHz, or of
G.711 (ITU-T), the telephone's 8 kHz codes: mu-law (`g711_ulaw`) and A-law (`g711_alaw`),
each of the 256 codes decoded once, encoding by the nearest code. The Realtime API's
formats are these, as are a telephony stream's.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from .conversation.options import invalid, shown

PCM_RATE = 24000  # pcm16 in and out, as the Realtime API defines it
G711_RATE = 8000
# each format by its name (the Realtime beta's) and as a MIME type object (its GA's)
MIME = {"pcm16": {"type": "audio/pcm", "rate": PCM_RATE}, "g711_ulaw": {"type": "audio/pcmu"},
        "g711_alaw": {"type": "audio/pcma"}}
_BY_MIME = {m["type"]: name for name, m in MIME.items()}


def parse(value: Any, param: str) -> str:
    """A format's name, given it or its MIME object ({"type": "audio/pcm"})."""
    if isinstance(value, dict):
        t = value.get("type")
        if not isinstance(t, str) or t not in _BY_MIME:
            raise invalid(f"{param}.type must be one of {sorted(_BY_MIME)}, not {shown(t)}",
                          f"{param}.type")
        if t == "audio/pcm" and value.get("rate", PCM_RATE) != PCM_RATE:
            raise invalid(f"{param}.rate must be {PCM_RATE}", f"{param}.rate")
        return _BY_MIME[t]
    if not isinstance(value, str) or value not in MIME:
        raise invalid(f"{param} must be one of {sorted(MIME)} (or a GA format object), not "
                      f"{shown(value)}", param)
    return value


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, ((a & 0x0F) << 4) + 8, (((a & 0x0F) << 4) + 0x108) << (seg - 1))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_TABLES = {"g711_ulaw": _ulaw_table(), "g711_alaw": _alaw_table()}
_ORDER = {k: np.argsort(t, kind="stable") for k, t in _TABLES.items()}


def decode_g711(data: bytes, fmt: str) -> np.ndarray:
    return _TABLES[fmt][np.frombuffer(data, dtype=np.uint8)]


def encode_g711(pcm: np.ndarray, fmt: str) -> bytes:
    table, order = _TABLES[fmt], _ORDER[fmt]
    s = table[order]
    i = np.clip(np.searchsorted(s, pcm), 1, len(s) - 1)
    x = pcm.astype(np.int32)
    nearer = np.where(np.abs(x - s[i - 1]) <= np.abs(s[i].astype(np.int32) - x), i - 1, i)
    return order[nearer].astype(np.uint8).tobytes()


def to_8k(pcm: np.ndarray) -> np.ndarray:
    """24 kHz -> 8 kHz: the mean of each three samples (a low-pass that keeps every tick
    whole: a resampler would hold samples back across ticks)."""
    n = len(pcm) // 3 * 3
    return pcm[:n].reshape(-1, 3).mean(axis=1).astype(np.int16)


def rate(fmt: str) -> int:
    return PCM_RATE if fmt == "pcm16" else G711_RATE


def decode(b64: Any, fmt: str, param: str, limit: int) -> np.ndarray:
    """An event's base64 audio (at most `limit` bytes of it) as int16 samples at its
    format's rate; a ConversationError names `param` if it is not that."""
    if not isinstance(b64, str):
        raise invalid(f"{param} must be base64 audio", param)
    if len(b64) > limit:
        raise invalid(f"{param} is {len(b64):,} bytes of base64; an event takes at most "
                      f"{limit:,}: send the audio in smaller appends", param)
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{param} is not valid base64", param) from None
    if fmt != "pcm16":
        return decode_g711(data, fmt)
    if len(data) % 2:
        raise invalid(f"{param}: pcm16 audio is whole 16-bit samples; {len(data)} bytes "
                      "is not", param)
    return np.frombuffer(data, dtype=np.int16)


def encode(pcm: bytes, fmt: str) -> str:
    """24 kHz pcm16 as an event's base64 audio in format `fmt`."""
    if fmt != "pcm16":
        pcm = encode_g711(to_8k(np.frombuffer(pcm, dtype=np.int16)), fmt)
    return base64.b64encode(pcm).decode("ascii")
