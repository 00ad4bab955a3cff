"""Prometheus metrics of the thinker, and the small HTTP side that serves them.

Names are the team's (CONTRIBUTING.md): dashboards query them as written. Each server
owns its registry, so tests can run several servers in one process.

HTTP: GET /metrics (Prometheus text) and GET /healthz (200 `{"status": "SERVING"}` once
the model is warm and the engine answers, 503 `{"status": "NOT_SERVING"}` otherwise: the
body every service's /healthz answers, CONTRIBUTING.md "Service shell"). A bare asyncio
server: two routes do not justify a web framework in the image.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

# Seed 001 measured TTFT 0.078 s on an L40S; the gate is 80 ms. Fine buckets below 0.2 s.
_TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
_TPS_BUCKETS = (5, 10, 25, 50, 100, 150, 200, 300, 500, 1000, 2000)
HEALTH_BODY = {True: b'{"status": "SERVING"}', False: b'{"status": "NOT_SERVING"}'}


class ThinkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "llm_ttft_seconds",
            "Chat request received to first text delta out",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("llm_generated_tokens", "Completion tokens generated", registry=r)
        self.tokens_per_second = Histogram(
            "llm_tokens_per_second",
            "Per request: completion tokens / (last token - first token) seconds",
            buckets=_TPS_BUCKETS,
            registry=r,
        )
        self.active = Gauge("llm_active_requests", "Chat calls in flight", registry=r)
        self.aborts = Counter(
            "llm_aborts", "Generations aborted before their end (cancel, error)", registry=r
        )
        self.errors = Counter(
            "llm_errors", "Chat calls ended with a gRPC error", ["code"], registry=r
        )
        self.requests = Counter("llm_requests", "Chat calls by outcome", ["outcome"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def start_http(
    host: str, port: int, metrics: ThinkerMetrics, healthy: Callable[[], bool]
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method != "GET":
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, metrics.render()
            elif path == "/healthz":
                ok = healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", HEALTH_BODY[ok]
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"/metrics or /healthz\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    return server
