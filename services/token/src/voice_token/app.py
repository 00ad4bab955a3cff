"""The HTTP app: routes, CORS, rate limiting, request ids, metrics.

    GET  /            the voice page (static/index.html + the bundled LiveKit client);
                      it uses LiveKit, or the agent's WebSocket when LIVEKIT_URL is empty
    POST /api/token   {room, identity, name?} -> {server_url, participant_token, expires_at}
                      (409 without LiveKit: there is nothing to sign a token for)
    OPTIONS /api/token  CORS preflight for allowlisted origins
    GET  /healthz     {"status": "SERVING", ...}
    GET  /metrics     Prometheus text

Order of checks on /api/token: origin (403), rate limit (429), content type (415),
body (413/400), who may have that token (401/403, grants.py), then minting. Every error
is JSON `{"error": message, "field"?: name}`.
The app never sees the API secret except inside its `TokenMinter`.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from voice_keys import bearer
from voice_keys.origins import own_host

from voice_token import __version__
from voice_token.grants import HOW, GrantPolicy
from voice_token.metrics import Metrics
from voice_token.ratelimit import RateLimiter
from voice_token.settings import EXAMPLE_SECRET, Settings
from voice_token.tokens import TokenMinter
from voice_token.validation import MAX_BODY_BYTES, RequestError, parse_token_request

log = logging.getLogger("voice_token.http")
STATIC_DIR = Path(__file__).parent / "static"
BUNDLE = STATIC_DIR / "dist" / "app.js"
# Scripts only from us (the bundle; no inline script, no CDN); connections and media are
# left open because LIVEKIT_URL can be any host.
PAGE_CSP = ("script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
            "form-action 'self'")

SETTINGS_KEY = web.AppKey("settings", Settings)
MINTER_KEY = web.AppKey("minter", TokenMinter)
LIMITER_KEY = web.AppKey("limiter", RateLimiter)
POLICY_KEY = web.AppKey("policy", GrantPolicy)
METRICS_KEY = web.AppKey("metrics", Metrics)
REQUEST_ID = web.RequestKey("request_id", str)
LOG_EXTRA = web.RequestKey("log_extra", dict)


def build_app(settings: Settings, *, limiter: RateLimiter | None = None) -> web.Application:
    app = web.Application(middlewares=[_request_context], client_max_size=MAX_BODY_BYTES * 4)
    app[SETTINGS_KEY] = settings
    if settings.transport == "livekit":
        api_key, api_secret = settings.credentials()
        if api_secret == EXAMPLE_SECRET:
            log.warning("LIVEKIT_API_SECRET is .env.example's public one: anyone can sign "
                        "tokens for this LiveKit; set your own (openssl rand -hex 32)")
        app[MINTER_KEY] = TokenMinter(
            api_key, api_secret, dt.timedelta(seconds=settings.token_ttl_seconds),
            settings.token_agent_name,
        )
    app[POLICY_KEY] = GrantPolicy.from_settings(settings)
    app[LIMITER_KEY] = limiter or RateLimiter(
        settings.token_rate_limit_per_minute, settings.token_rate_limit_burst
    )
    app[METRICS_KEY] = Metrics()
    app.router.add_get("/", _index)
    app.router.add_post("/api/token", _token)
    app.router.add_route("OPTIONS", "/api/token", _preflight)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
    if not BUNDLE.is_file():
        log.warning("page bundle missing; run services/token/setup.sh", extra={"path": str(BUNDLE)})
    return app


# --- middleware ----------------------------------------------------------------------

@web.middleware
async def _request_context(request: web.Request, handler):  # type: ignore[no-untyped-def]
    rid = request.headers.get("X-Request-Id", "")
    if not (0 < len(rid) <= 64 and rid.replace("-", "").isalnum()):
        rid = uuid.uuid4().hex[:16]
    request[REQUEST_ID] = rid
    t0 = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as e:
        response = e
    except Exception:
        log.exception("unhandled error", extra={"request_id": rid, "path": request.path})
        response = _error(500, f"internal error (request id {rid})")
    response.headers["X-Request-Id"] = rid
    if request.path != "/metrics" and request.path != "/healthz":
        log.info(
            "request",
            extra={
                "request_id": rid, "method": request.method, "path": request.path,
                "status": response.status, "ms": round((time.perf_counter() - t0) * 1e3, 2),
                "client": _client_key(request), **request.get(LOG_EXTRA, {}),
            },
        )
    if isinstance(response, web.HTTPException):
        raise response
    return response


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, str] = {"error": message}
    if field:
        body["field"] = field
    return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})


def _forwarded(request: web.Request, header: str) -> str:
    """What our trusted proxies put in `header`: its TOKEN_PROXY_HOPS-th entry from the
    right (each proxy appends the address it saw; the client controls only the left)."""
    hops = [h.strip() for h in request.headers.get(header, "").split(",") if h.strip()]
    if not hops:
        return ""
    return hops[-min(request.app[SETTINGS_KEY].token_proxy_hops, len(hops))]


def _client_key(request: web.Request) -> str:
    if request.app[SETTINGS_KEY].token_trust_proxy:
        hop = _forwarded(request, "X-Forwarded-For")
        if hop:
            return hop
    return request.remote or "unknown"


# --- CORS ------------------------------------------------------------------------------

def _origin_allowed(request: web.Request, origin: str) -> bool:
    allow = request.app[SETTINGS_KEY].token_cors_origins
    origin = origin.rstrip("/").lower()
    if "*" in allow or origin in allow:
        return True
    # Same origin (the page itself). Host, not scheme: a TLS proxy in front makes our
    # scheme http while the browser's is https; a trusted proxy may also rewrite Host.
    # The Host a browser sends is the page's own name, whatever it resolved to: it counts
    # only where it is a name of ours (else a DNS-rebinding page, evil.example resolved to
    # 127.0.0.1, would be same-origin).
    url = urlsplit(origin)
    hosts = set()
    if own_host(url.hostname, {urlsplit(o).hostname for o in allow} - {None}):
        hosts.add((request.host or "").lower())
    if request.app[SETTINGS_KEY].token_trust_proxy:
        hosts.add(_forwarded(request, "X-Forwarded-Host").lower())
    return url.netloc in hosts - {""}


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": "POST, OPTIONS",
        "Access-Control-Allow-Headers": "Content-Type, X-Request-Id, Authorization",
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }


async def _preflight(request: web.Request) -> web.Response:
    origin = request.headers.get("Origin")
    if not origin or not _origin_allowed(request, origin):
        return _error(403, f"origin {origin!r} is not allowed (see TOKEN_CORS_ORIGINS)")
    return web.Response(status=204, headers=_cors_headers(origin))


# --- routes ----------------------------------------------------------------------------

async def _token(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    t0 = time.perf_counter()
    response = await _token_response(request)
    metrics.requests.labels(status=str(response.status)).inc()
    metrics.duration.observe(time.perf_counter() - t0)
    metrics.tracked_clients.set(len(request.app[LIMITER_KEY]))
    origin = request.headers.get("Origin")
    if origin and response.status != 403:
        response.headers.update(_cors_headers(origin))
    return response


async def _token_response(request: web.Request) -> web.Response:
    origin = request.headers.get("Origin")
    if origin and not _origin_allowed(request, origin):
        return _error(403, f"origin {origin!r} is not allowed (see TOKEN_CORS_ORIGINS)")
    if MINTER_KEY not in request.app:
        return _error(409, "no LiveKit server is configured (LIVEKIT_URL is empty): the page "
                      "talks to the agent over its WebSocket, TOKEN_AGENT_WS_URL")
    wait = request.app[LIMITER_KEY].acquire(_client_key(request))
    if wait > 0:
        retry = max(1, int(wait + 0.999))
        resp = _error(429, f"too many token requests; retry in {retry} s")
        resp.headers["Retry-After"] = str(retry)
        return resp
    if request.content_type != "application/json":
        return _error(415, "Content-Type must be application/json")
    if (request.content_length or 0) > MAX_BODY_BYTES:
        return _error(413, f"body too large (limit {MAX_BODY_BYTES} bytes)")
    try:
        req = parse_token_request(await request.read())
    except RequestError as e:
        return _error(e.status, str(e), e.field)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"body too large (limit {MAX_BODY_BYTES} bytes)")
    header = request.headers.get("Authorization")
    key = bearer(header)
    try:
        if header is not None and key is None:
            # A key in another scheme, or none after "Bearer", is a wrong key, not the
            # absence of one: it must not fall through to an anonymous token.
            raise RequestError(f"the Authorization header is not `Bearer <key>`: {HOW}",
                               status=401)
        caller = request.app[POLICY_KEY].check(req, key)
    except RequestError as e:
        resp = _error(e.status, str(e), e.field)
        if e.status == 401:
            resp.headers["WWW-Authenticate"] = "Bearer"
        return resp
    request[LOG_EXTRA] = {"room": req.room, "identity": req.identity, "caller": caller}
    settings = request.app[SETTINGS_KEY]
    issued = request.app[MINTER_KEY].mint(req.room, req.identity, req.name)
    return web.json_response(
        {
            "server_url": settings.livekit_url,
            "participant_token": issued.jwt,
            "expires_at": issued.expires_at.isoformat().replace("+00:00", "Z"),
        },
        headers={"Cache-Control": "no-store"},
    )


async def _index(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS_KEY]
    if not BUNDLE.is_file():
        return web.Response(
            status=503, content_type="text/html",
            text="<h1>Page not built</h1><p>The LiveKit client bundle is missing: run "
                 "<code>services/token/setup.sh</code> (npm + esbuild) and restart.</p>",
        )
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    page = page.replace(
        "{{CONNECT_TIMEOUT_MS}}", str(int(settings.token_connect_timeout_seconds * 1000))
    ).replace(
        "{{AGENT_TIMEOUT_MS}}", str(int(settings.token_agent_timeout_seconds * 1000))
    ).replace("{{VERSION}}", html.escape(__version__)).replace(
        "{{TRANSPORT}}", settings.transport
    ).replace("{{AGENT_WS_URL}}", html.escape(settings.token_agent_ws_url, quote=True))
    return web.Response(
        text=page, content_type="text/html",
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
                 "Referrer-Policy": "no-referrer", "Content-Security-Policy": PAGE_CSP},
    )


async def _healthz(request: web.Request) -> web.Response:
    # Liveness + config sanity: credentials were loaded at start-up (or we would not be
    # running). LiveKit itself is not probed: its URL is the browsers', not ours.
    return web.json_response(
        {"status": "SERVING", "version": __version__, "page_bundle": BUNDLE.is_file(),
         "transport": request.app[SETTINGS_KEY].transport}
    )


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
