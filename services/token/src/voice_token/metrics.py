"""Prometheus metrics of the token service, on a registry owned by the app (no globals,
so tests can build several apps in one process).

Names: `token_requests_total{status}` (the dashboards' name: every /api/token answer by
HTTP status), `token_request_duration_seconds` (time to answer /api/token) and
`token_ratelimit_tracked_clients` (clients the rate limiter currently tracks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "token_requests_total", "Token requests by HTTP status", ["status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "token_request_duration_seconds", "Time to answer a token request",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.tracked_clients = Gauge(
            "token_ratelimit_tracked_clients", "Clients the rate limiter currently tracks",
            registry=self.registry,
        )
