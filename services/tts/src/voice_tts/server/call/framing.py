"""Cuts the engine's PCM packets into fixed frames at the client's rate.

The engine emits float32 mono packets at its native rate (24 kHz) whose sizes follow the
codec (1920 samples a frame, 1–4 frames a packet). Clients want exactly `frame_ms` of
s16le at 16, 24 or 48 kHz. One `UtteranceFramer` per utterance resamples with soxr's
streaming resampler (state carried across packets, so there are no seams) and keeps the
remainder of a frame until the next packet; `finish()` drains the resampler and
zero-pads the last frame. At the native rate (the default) the engine's own s16le of the
packet (`AudioPacket.pcm16`, one conversion a step) is only sliced: no numpy call per
packet on the event loop. This module knows nothing about gRPC.
"""

from __future__ import annotations

import numpy as np
import soxr

from voice_tts.engine import to_s16


def to_s16le(pcm: np.ndarray) -> bytes:
    return to_s16(pcm).tobytes()


class UtteranceFramer:
    def __init__(self, native_rate: int, sample_rate: int, frame_ms: int) -> None:
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * frame_ms // 1000
        self._resampler = (
            None
            if sample_rate == native_rate
            else soxr.ResampleStream(native_rate, sample_rate, 1, dtype="float32", quality="HQ")
        )
        self._rest = np.zeros(0, dtype=np.float32)
        self._rest16 = b""
        self.samples_in = 0

    def push(self, native: np.ndarray, native16: bytes | None = None) -> list[bytes]:
        """Returns the whole frames this packet completes (s16le bytes each). `native16`:
        the same audio as s16le (`AudioPacket.pcm16`), cut as it is at the native rate."""
        pcm = np.asarray(native, dtype=np.float32).reshape(-1)
        self.samples_in += pcm.size
        if self._resampler is None:
            return self._cut16(native16 if native16 is not None else to_s16le(pcm), False)
        return self._cut(self._resampler.resample_chunk(pcm, last=False), last=False)

    def finish(self) -> list[bytes]:
        """Drains the resampler; the last frame is zero-padded to full size."""
        if self._resampler is None:
            return self._cut16(b"", last=True)
        tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return self._cut(tail, last=True)

    def _cut16(self, s16: bytes, last: bool) -> list[bytes]:
        """At the native rate: bytes sliced, no numpy on the event loop."""
        buf = self._rest16 + s16 if self._rest16 else s16
        size = self.frame_samples * 2
        n = len(buf) // size
        frames = [buf[i * size : (i + 1) * size] for i in range(n)]
        self._rest16 = buf[n * size :]
        if last and self._rest16:
            frames.append(self._rest16 + bytes(size - len(self._rest16)))
            self._rest16 = b""
        return frames

    def _cut(self, pcm: np.ndarray, last: bool) -> list[bytes]:
        buf = np.concatenate([self._rest, pcm]) if self._rest.size else pcm
        n = buf.size // self.frame_samples
        # One conversion per packet, then byte slices: numpy's per-call overhead per 20 ms
        # frame was ~4 us of the front's ~30 us per message (bench/front_bench.py).
        whole = to_s16le(buf[: n * self.frame_samples])
        size = self.frame_samples * 2
        frames = [whole[i * size : (i + 1) * size] for i in range(n)]
        self._rest = buf[n * self.frame_samples :]
        if last and self._rest.size:
            padded = np.zeros(self.frame_samples, dtype=np.float32)
            padded[: self._rest.size] = self._rest
            frames.append(to_s16le(padded))
            self._rest = np.zeros(0, dtype=np.float32)
        return frames
