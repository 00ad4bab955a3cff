"""The service's HTTP side: `/metrics` for Prometheus and `/healthz` for orchestrators.

`/healthz` answers 200 only once the engine is warm and the server is not draining:
the same state the gRPC health service reports.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


async def start_http(
    host: str, port: int, registry: CollectorRegistry, is_serving: Callable[[], bool]
) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = is_serving()
        return web.json_response({"status": "SERVING" if ok else "NOT_SERVING"},
                                 status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
