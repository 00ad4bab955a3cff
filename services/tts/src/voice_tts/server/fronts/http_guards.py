"""What the HTTP port (OpenAI speech API and the WebSocket) checks before a handler runs.

- Origin: a browser says which page sent a request. A page on another site may not
  start syntheses on a TTS the user can reach (localhost): a request with an `Origin`
  header passes only from the same host (a loopback name, an IP literal or a host named
  in TTS_CORS_ORIGINS: a DNS-rebinding page's own name in Host does not count) or from
  TTS_CORS_ORIGINS (`*`: any); allowed
  cross-origin callers get CORS headers and a preflight answer. No `Origin` (curl, the
  `openai` SDK, servers) passes: the API key is what guards those.
- Slow senders (slowloris): a connection is closed when a request's headers (the first
  or a keep-alive one's) are not all in TTS_HEADER_TIMEOUT_S after its first byte, or
  when its body comes slower than 1 KiB/s over any such period. aiohttp has neither
  (its keep-alive timeout covers only an idle connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web
from voice_keys.origins import own_host

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CORS_HEADERS = {"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Trace-Id",
                "Access-Control-Max-Age": "600", "Vary": "Origin"}


ALLOWED_ORIGIN = web.RequestKey("allowed_origin", str)


def origin_guard(allowed: list[str], refuse: Callable[[str], web.StreamResponse]
                 ) -> tuple[Callable[..., Awaitable[web.StreamResponse]],
                            Callable[[web.Request, web.StreamResponse], Awaitable[None]]]:
    """The Origin check (a middleware) and the CORS headers of allowed cross-origin
    answers (an on_response_prepare handler: streamed answers send headers early)."""
    allow = {o.rstrip("/").lower() for o in allowed}
    named = {urlsplit(o).hostname for o in allow} - {None}

    def ok(request: web.Request, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        url = urlsplit(origin)
        return ("*" in allow or origin in allow
                or (url.netloc == (request.host or "").lower()
                    and own_host(url.hostname, named)))

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if not ok(request, origin):
            return refuse(f"origin {origin[:100]!r} may not call this server (same origin "
                          "or TTS_CORS_ORIGINS)")
        request[ALLOWED_ORIGIN] = origin
        if request.method == "OPTIONS":  # the preflight of an allowed origin
            return web.Response(status=204)
        return await handler(request)

    async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.get(ALLOWED_ORIGIN)
        if origin is not None:
            response.headers.update({"Access-Control-Allow-Origin": origin, **CORS_HEADERS})

    return check, cors_headers


class HeaderDeadline(asyncio.Protocol):
    """Stands in front of one connection's protocol and closes the connection when a
    request's headers are not all in `seconds` after its first byte: the first request's
    from the connection's start, a keep-alive request's from its first byte (an idle
    keep-alive connection is aiohttp's keep-alive timeout's). `Deadlines.middleware`
    says when aiohttp has parsed a request's headers (`headers_done`) and when its handler
    is done (`request_done`); the body has its own watchdog (`_watch_body`)."""

    def __init__(self, inner: asyncio.Protocol, seconds: float, guards: Deadlines) -> None:
        self.inner, self.seconds, self.guards = inner, seconds, guards
        self.transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._between = False  # a response done: the next byte starts a request

    def _start(self) -> None:
        assert self.transport is not None
        self._timer = asyncio.get_running_loop().call_later(self.seconds,
                                                            self.transport.close)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guards.conns[transport] = self
        self.inner.connection_made(transport)
        self._start()

    def headers_done(self) -> None:
        self._between = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_done(self) -> None:
        self._between = True

    def data_received(self, data: bytes) -> None:
        if self._between and self._timer is None:
            self._between = False
            self._start()
        self.inner.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.guards.conns.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class Deadlines:
    """The deadlines of one site's connections: a request's headers within `seconds`
    of its first byte (`HeaderDeadline`), and its body at `MIN_BODY_RATE` bytes a second
    or better, checked every `seconds` (a body trickled a byte at a time is cut; one the
    handler is slow to read is not: aiohttp has stopped reading the socket then)."""

    MIN_BODY_RATE = 1024  # bytes/s: a phone on a bad link sends far more

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.conns: dict[asyncio.BaseTransport, HeaderDeadline] = {}

    def protocol(self, inner: asyncio.Protocol) -> HeaderDeadline:
        return HeaderDeadline(inner, self.seconds, self)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.conns.get(request.transport) if request.transport is not None else None
        if conn is None:  # not one of ours (a test client)
            return await handler(request)
        conn.headers_done()
        if not request.content.is_eof():
            self._watch_body(request, conn, request.content.total_bytes)
        try:
            return await handler(request)
        finally:
            conn.request_done()

    def _watch_body(self, request: web.Request, conn: HeaderDeadline, seen: int) -> None:
        def tick() -> None:
            transport = conn.transport
            if transport is None or transport.is_closing() or request.content.is_eof():
                return
            got = request.content.total_bytes
            paused = getattr(request.protocol, "_reading_paused", False)  # our backlog
            if not paused and got - seen < self.MIN_BODY_RATE * self.seconds:
                transport.close()
                return
            self._watch_body(request, conn, got)

        asyncio.get_running_loop().call_later(self.seconds, tick)


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections get `deadlines` (its middleware must be the app's)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int,
                 deadlines: Deadlines) -> None:
        super().__init__(runner, host, port)
        self._deadlines = deadlines

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: self._deadlines.protocol(server()), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port)
