"""Shared fixtures: speech-like synthetic replies (noise with a syllable envelope, as the
tiny random TTS produces) and their frame arrival times at a 20 ms cadence."""

from __future__ import annotations

import numpy as np
import pytest
from voice_autortc.faults import Received

RATE = 24000
FRAME = RATE // 50


def speechlike(seconds: float = 3.0, level: float = 0.1, seed: int = 0,
               pauses: list[tuple[float, float]] | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    env = 0.5 + 0.5 * np.sin(np.arange(n) / RATE * 2 * np.pi * 3) ** 2
    x = rng.standard_normal(n) * level * env
    for a, b in pauses or []:
        x[int(a * RATE) : int(b * RATE)] = 0.0
    return np.clip(x, -0.95, 0.95).astype(np.float32)


def received(x: np.ndarray, t0: float = 100.0, jitter_ms: float = 0.0) -> Received:
    n = len(x) // FRAME
    rng = np.random.default_rng(1)
    arr = [t0 + i * 0.02 + (rng.uniform(0, jitter_ms) / 1000 if jitter_ms else 0.0)
           for i in range(n)]
    return Received(RATE, x[: n * FRAME], arr, FRAME)


@pytest.fixture
def reply() -> np.ndarray:
    return speechlike()
