"""Statistics the benchmarks share, with no dependencies (the soak's report, the ear)."""

from __future__ import annotations

import math


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))]
