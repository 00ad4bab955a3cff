"""The service's HTTP side: `/metrics` for Prometheus, `/healthz` for orchestrators, and
the speech interfaces other TTS servers offer: OpenAI's `POST /v1/audio/speech` (with
`/v1/models`; `openai_speech.py`), the voice library (`/v1/audio/voices`, create / list /
get / delete; `voices_http.py`) and a live-text WebSocket,
`/v1/audio/speech/stream` (`ws_speech.py`). Both are adapters over `Synthesis.call`, as
gRPC is.

`/healthz` answers 200 only once the engine is warm and the server is not draining:
the same state the gRPC health service reports. Every error, the framework's own too (an
unknown path, a wrong method, a bug), is an OpenAI error body, never aiohttp's page.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from voice_keys import ApiKeys, bearer

from voice_tts.server.call.synthesis import Synthesis
from voice_tts.server.fronts.http_guards import Deadlines, GuardedSite, origin_guard
from voice_tts.server.fronts.openai_speech import MAX_BODY_BYTES, ApiError, SpeechAPI, Truncate
from voice_tts.server.fronts.voices_http import VoicesAPI
from voice_tts.server.fronts.ws_speech import WS_PATH, SpeechSocket
from voice_tts.server.voices.voice_library import VoiceLibrary

log = logging.getLogger("voice_tts.http")


@web.middleware
async def error_bodies(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        return ApiError(e.status, e.reason, code=e.reason.lower().replace(" ", "_"),
                        kind=kind).response()
    except Truncate:  # headers sent: the connection closes mid-body, on purpose
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path[:200])
        return ApiError(500, "internal error (the server's log has it)", code="internal",
                        kind="server_error").response()


# API keys (voice_keys; TTS_API_KEYS, TTS_API_KEYS_FILE): gRPC metadata and the HTTP
# header `authorization: Bearer <key>` (the `openai` SDK's `api_key`), or `?api_key=` on
# the WebSocket (a browser cannot set its headers). Health and metrics stay open.
OPEN_HTTP = ("/healthz", "/metrics")


def key_check(keys: ApiKeys) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if request.path in OPEN_HTTP:
            return await handler(request)
        key = bearer(request.headers.get("Authorization"))
        if key is None and request.path == WS_PATH:  # a browser cannot set the header
            key = request.query.get("api_key")
        if not keys.allows(key):
            resp = ApiError(401, keys.refusal(key), code="invalid_api_key").response()
            resp.headers["WWW-Authenticate"] = "Bearer"
            return resp
        return await handler(request)

    return check


async def start_http(host: str, port: int, registry: CollectorRegistry,
                     is_serving: Callable[[], bool], calls: Synthesis | None = None,
                     keys: ApiKeys | None = None, library: VoiceLibrary | None = None,
                     cors_origins: list[str] | None = None,
                     header_timeout_s: float = 10.0) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = is_serving()
        return web.json_response({"status": "SERVING" if ok else "NOT_SERVING"},
                                 status=200 if ok else 503)

    def forbidden(message: str) -> web.StreamResponse:
        return ApiError(403, message, code="origin_not_allowed").response()

    checks = [key_check(keys)] if keys is not None and keys.enabled else []
    origins, cors_headers = origin_guard(cors_origins or [], forbidden)
    deadlines = Deadlines(header_timeout_s)
    app = web.Application(client_max_size=MAX_BODY_BYTES,
                          middlewares=[deadlines.middleware, error_bodies, origins, *checks])
    app.on_response_prepare.append(cors_headers)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    if calls is not None:
        SpeechAPI(calls).add_routes(app, voices=library is None)
        if library is not None:
            VoicesAPI(library).add_routes(app)
        SpeechSocket(calls).add_routes(app)
    # A client that goes away cancels its handler: its engine session ends at once.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await GuardedSite(runner, host, port, deadlines).start()
    return runner
