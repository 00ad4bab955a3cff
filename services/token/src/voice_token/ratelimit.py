"""Per-client token bucket: `burst` requests at once, refilled at `per_minute`.

In-process and per replica: enough to stop one browser tab (or script) from minting
tokens in a loop. A fleet behind a load balancer would put this at the proxy instead.
Memory is bounded: when the table grows past `max_clients`, buckets that have refilled
completely (clients idle long enough to be indistinguishable from new ones) are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(
        self,
        per_minute: int,
        burst: int,
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert per_minute > 0 and burst > 0, "rate and burst must be positive"
        self.rate = per_minute / 60.0  # tokens per second
        self.burst = float(burst)
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def acquire(self, client: str) -> float:
        """Take one token for `client`: 0.0 if allowed, else seconds until one is free."""
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= self.max_clients:
                self._prune(now)
            bucket = self._buckets[client] = _Bucket(self.burst, now)
        else:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)

    def _prune(self, now: float) -> None:
        full = [
            k for k, b in self._buckets.items()
            if b.tokens + (now - b.updated) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_clients:
            # Everyone is active: drop the stalest half rather than grow without bound.
            stale = sorted(self._buckets, key=lambda k: self._buckets[k].updated)
            for k in stale[: len(stale) // 2]:
                del self._buckets[k]
