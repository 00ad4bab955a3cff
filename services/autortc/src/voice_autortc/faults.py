"""P1 decoder faults: what a broken codec or mixer at the listener does to the sound.

The probe applies a case's fault to the reply it received, after the run and before
any metric runs: these are signal transforms, not faults the session lives through.
Network faults (loss, jitter, stalls) are not here: link.py impairs the live stream.
Each fault leaves the fingerprint the gates look for (seed 000: spike=1, drift=2.04,
mel=9.74 were the seed's P1 fingerprints):

- boom: clicks at full scale (a popping codec or a glitching mixer) -> spikes,
  clipping_ratio.
- speed: the reply played at `rate` x (clock drift between sender and receiver,
  time-stretch plus pitch shift) -> speed_drift, mel_distance.
- distort: muffled (low-pass, a narrowband codec) then over-driven into saturation
  -> clipping_ratio, hf_ratio_drop, mel_distance.

Everything is deterministic: the same input gives the same faulty output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .audio import resample
from .audio_metrics import audible_span
from .cases import Fault


@dataclass
class Received:
    """What the probe got: 20 ms (or other) frames and when each arrived (perf seconds)."""

    rate: int
    audio: np.ndarray  # float mono, the frames concatenated
    arrivals: list[float]
    frame_samples: int

    def frame_count(self) -> int:
        return len(self.audio) // self.frame_samples if self.frame_samples else 0


def _audible_bounds(x: np.ndarray, rate: int) -> tuple[int, int]:
    a, b = audible_span(x, rate)
    hop = rate // 100
    return (a * hop, b * hop) if b > a else (0, len(x))


def boom(rx: Received, f: Fault) -> Received:
    x = rx.audio.copy()
    a, b = _audible_bounds(x, rx.rate)
    n = max(1, int(rx.rate * f.click_ms / 1000))
    for k in range(f.clicks):
        at = a + (b - a) * (k + 1) // (f.clicks + 1)
        # A square burst at full scale: the loudest thing a 16-bit link can carry.
        burst = np.where((np.arange(n) // max(1, rx.rate // 2000)) % 2 == 0, 1.0, -1.0)
        x[at : at + n] = burst[: len(x[at : at + n])]
    return Received(rx.rate, x.astype(np.float32), list(rx.arrivals), rx.frame_samples)


def speed(rx: Received, f: Fault) -> Received:
    # Played back f.rate times faster: fewer samples for the same content.
    y = resample(rx.audio, round(rx.rate * f.rate), rx.rate)
    frames = max(1, len(y) // rx.frame_samples)
    return Received(rx.rate, y[: frames * rx.frame_samples], list(rx.arrivals[:frames]),
                    rx.frame_samples)


def _lowpass(x: np.ndarray, rate: int, cutoff_hz: float) -> np.ndarray:
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(len(x), 1.0 / rate)
    spec[freqs > cutoff_hz] = 0.0
    return np.fft.irfft(spec, n=len(x)).astype(np.float32)


def distort(rx: Received, f: Fault) -> Received:
    x = _lowpass(rx.audio, rx.rate, f.lowpass_hz)
    # Drive relative to the peak, so the saturation is the same at any input level.
    peak = float(np.max(np.abs(x))) if len(x) else 0.0
    x = np.clip(x / max(peak, 1e-6) * 10 ** (f.drive_db / 20), -1.0, 1.0)
    return Received(rx.rate, x.astype(np.float32), list(rx.arrivals), rx.frame_samples)


FAULTS = {"boom": boom, "speed": speed, "distort": distort}


def apply_fault(rx: Received, fault: Fault | None) -> Received:
    """The received reply as a broken transport would have delivered it (None = clean)."""
    return rx if fault is None else FAULTS[fault.kind](rx, fault)
