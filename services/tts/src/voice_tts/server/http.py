"""The service's HTTP side: `/metrics` for Prometheus, `/healthz` for orchestrators, and
the speech interfaces other TTS servers offer: OpenAI's `POST /v1/audio/speech` (with
`/v1/models`, `/v1/audio/voices`; `openai_speech.py`) and a live-text WebSocket,
`/v1/audio/speech/stream` (`ws_speech.py`). Both are adapters over `Synthesis.call`, as
gRPC is.

`/healthz` answers 200 only once the engine is warm and the server is not draining:
the same state the gRPC health service reports.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from voice_tts.server.openai_speech import MAX_BODY_BYTES, SpeechAPI
from voice_tts.server.synthesis import Synthesis
from voice_tts.server.ws_speech import SpeechSocket


async def start_http(host: str, port: int, registry: CollectorRegistry,
                     is_serving: Callable[[], bool], calls: Synthesis | None = None
                     ) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = is_serving()
        return web.json_response({"status": "SERVING" if ok else "NOT_SERVING"},
                                 status=200 if ok else 503)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    if calls is not None:
        SpeechAPI(calls).add_routes(app)
        SpeechSocket(calls).add_routes(app)
    # A client that goes away cancels its handler: its engine session ends at once.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
