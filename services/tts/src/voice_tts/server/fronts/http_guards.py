"""What the HTTP port (OpenAI speech API and the WebSocket) checks before a handler runs.

- Origin: a browser says which page sent a request. A page on another site may not
  start syntheses on a TTS the user can reach (localhost): a request with an `Origin`
  header passes only from the same host or from TTS_CORS_ORIGINS (`*`: any); allowed
  cross-origin callers get CORS headers and a preflight answer. No `Origin` (curl, the
  `openai` SDK, servers) passes: the API key is what guards those.
- Slow headers (slowloris): a connection whose first request's headers have not all
  arrived within TTS_HEADER_TIMEOUT_S is closed. aiohttp has no such timeout of its own
  (its keep-alive timeout starts after a first response).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

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

    def ok(request: web.Request, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        return ("*" in allow or origin in allow
                or urlsplit(origin).netloc == (request.host or "").lower())

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
    """Stands in front of one connection's protocol and closes the connection if its
    first request's headers (up to the first blank line) are not all in after
    `seconds`; from then on it only passes calls through."""

    def __init__(self, inner: asyncio.Protocol, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)
        self._timer = asyncio.get_running_loop().call_later(self.seconds, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-3:]
        self.inner.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections get a `HeaderDeadline`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int,
                 header_timeout_s: float) -> None:
        super().__init__(runner, host, port)
        self._header_timeout_s = header_timeout_s

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: HeaderDeadline(server(), self._header_timeout_s), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port)
