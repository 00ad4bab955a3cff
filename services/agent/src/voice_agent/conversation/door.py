"""The door every conversation route opens the same way (`Door`): who may connect (the
page's origin, the API key), how many sockets may be open, the conversation slots
(AGENT_WS_MAX_SESSIONS, shared by `/v1/talk` and `/v1/realtime`) and none while the
process runs late (AGENT_ADMIT_MAX_LAG_MS). A refusal is a `Refused` with its reason;
each route says it in its own wire's words. Then the conversation runs on its socket
until either side ends it (`converse`).

Not here: authentication beyond the API key (bind AGENT_HTTP_HOST to loopback or put an
authenticating proxy in front).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import Counter, Gauge
from voice_keys import ApiKeys, bearer
from voice_keys.origins import own_host

from ..load import MONITOR
from ..metrics import REGISTRY
from ..settings import AgentSettings
from .outbox import Outbox

LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")  # one host, whichever name a page uses
TRY_AGAIN_LATER = 1013  # RFC 6455's close code for a server at capacity

SESSIONS = Gauge("agent_ws_sessions", "/v1/talk and /v1/realtime conversations under way "
                 "(started, not ended)", registry=REGISTRY)
REFUSED = Counter("agent_ws_refused_total", "/v1/talk and /v1/realtime connections refused, "
                  "by reason", ["reason"], registry=REGISTRY)
for _reason in ("busy", "overloaded"):  # exported at 0 before the first refusal
    REFUSED.labels(reason=_reason)


class Refused(Exception):
    """Why the door stays shut: `code` (origin_not_allowed, unauthorized, busy), the
    message for the client, the HTTP status before an upgrade, the metric's reason."""

    def __init__(self, code: str, message: str, status: int, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status
        self.reason = reason or code
        self.close_code = TRY_AGAIN_LATER


class Door:
    """Admission for every conversation route of the process (see the module)."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.sockets: set[web.WebSocketResponse] = set()  # open, started or not
        self.talking = 0  # conversations under way: the slots taken
        # Sockets waiting to start cost little but are bounded too; conversations are
        # counted apart, from their start.
        self.max_open = 4 * settings.ws_max_sessions + 16
        self.keys = ApiKeys(settings.api_keys.get_secret_value(), settings.api_keys_file,
                            file_setting="AGENT_API_KEYS_FILE",
                            how="send `Authorization: Bearer <key>`, or ?api_key=<key> "
                            "from a browser")

    def check(self, request: web.Request, path: str) -> None:
        """Before the upgrade: the page's origin and the API key (no socket, no slot)."""
        if not self.origin_allowed(request):
            raise Refused("origin_not_allowed", f"origin {request.headers['Origin'][:100]!r} "
                          f"may not open {path} (the agent's own host, or AGENT_WS_ORIGINS)",
                          403, "origin")
        key = bearer(request.headers.get("Authorization")) or request.query.get("api_key")
        if not self.keys.allows(key):
            raise Refused("unauthorized", self.keys.refusal(key), 401)

    def origin_allowed(self, request: web.Request) -> bool:
        """A browser's page may talk from the agent's own host (any port: the mesh's page
        is served by the token service next door) or from AGENT_WS_ORIGINS; a page on
        another site may not drive a visitor's browser into the agent. No Origin: not a
        browser (the key, if any, guards those). The agent's own host is a name it knows:
        a loopback name, an IP literal or a host named in AGENT_WS_ORIGINS; any other name
        in Host is the page's own (DNS rebinding: evil.example resolved to 127.0.0.1)."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        origin = origin.rstrip("/").lower()
        allowed = {o.strip().rstrip("/").lower() for o in self.settings.ws_origins.split(",")}
        host, ours = urlsplit(origin).hostname, (request.url.host or "").lower()
        if "*" in allowed or origin in allowed or host is None:
            return "*" in allowed or origin in allowed
        own = own_host(host, {urlsplit(o).hostname for o in allowed} - {None})
        return (host == ours and own) or (host in LOOPBACK and ours in LOOPBACK)

    async def upgrade(self, request: web.Request, path: str, max_msg_size: int,
                      refusal: Callable[[Refused], dict[str, Any]],
                      converse: Callable[[web.WebSocketResponse], Awaitable[None]],
                      ) -> web.StreamResponse:
        """A route's socket: checked before the upgrade (a refusal is `refusal`'s JSON
        with its HTTP status), then held among the open ones while `converse` runs; a
        refusal after the upgrade (busy) is that JSON, then the close."""
        try:
            self.check(request, path)
        except Refused as e:  # before the upgrade: no socket, no slot
            REFUSED.labels(reason=e.reason).inc()
            return web.json_response(refusal(e), status=e.status, headers=(
                {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}))
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=max_msg_size)
        await ws.prepare(request)
        try:
            with self.opened(ws):
                await converse(ws)
        except Refused as e:
            REFUSED.labels(reason=e.reason).inc()
            await close_with(ws, refusal(e), e.close_code, e.code)
        return ws

    @contextmanager
    def opened(self, ws: web.WebSocketResponse) -> Iterator[None]:
        """An upgraded socket holds its place among the open ones until it closes."""
        if len(self.sockets) >= self.max_open:
            raise Refused("busy", f"too many connections ({self.max_open}) are open or "
                          "waiting to start; try again later", 503)
        self.sockets.add(ws)
        try:
            yield
        finally:
            self.sockets.discard(ws)

    def take_slot(self) -> Callable[[], None]:
        """A conversation slot (AGENT_WS_MAX_SESSIONS), taken when it starts: a socket
        that never starts holds none. The returned call gives it back, once."""
        limit = self.settings.ws_max_sessions
        if self.talking >= limit:
            raise Refused("busy", f"the agent is at capacity ({limit} conversations, "
                          "AGENT_WS_MAX_SESSIONS); try again later", 503)
        lag_limit = self.settings.admit_max_lag_ms
        # An idle process always takes one: its lateness is not its conversations' (a
        # busy shared host, e.g. the 2-core mesh), and refusing would serve nobody.
        if self.talking > 0 and MONITOR.overloaded(lag_limit):
            raise Refused(
                "busy", f"the agent's host is overloaded: it runs {MONITOR.lag_s() * 1000:.0f} "
                f"ms late (over AGENT_ADMIT_MAX_LAG_MS={lag_limit}), so another conversation "
                f"would break up every reply ({self.talking} under way); try again later",
                503, "overloaded")
        self.talking += 1
        SESSIONS.inc()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.talking -= 1
                SESSIONS.dec()

        return release


async def close_with(ws: web.WebSocketResponse, message: dict[str, Any], code: int,
                     reason: str) -> None:
    """The client hears why (one JSON message), then the socket closes with `code`."""
    if ws.closed:
        return
    with contextlib.suppress(Exception):
        await ws.send_str(json.dumps(message, ensure_ascii=False))
        await ws.close(code=code, message=reason.encode())


async def converse(outbox: Outbox, receive: Coroutine[Any, Any, None],
                   start: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]],
                   release: Callable[[], None], name: str,
                   ended: Callable[[asyncio.Task[None]], Awaitable[None]] | None = None,
                   ) -> asyncio.Task[None]:
    """One conversation on its socket until either side ends it: the client going (or
    `receive` raising: the door's protocol error), or the client no longer reading (its
    outbox stalls). `ended(receiver)` may answer at once (a protocol error heard before
    the teardown). Then the slot is `release`d first (the teardown awaits a client that
    may have stopped reading, and a close that raised once kept the slot until a
    restart), the conversation `close`s (shielded: a client's reset still stops its
    thinker and TTS work), and what was queued goes out for up to 2 s. Returns the
    receiver, done."""
    sender = asyncio.create_task(outbox.run(), name=f"{name}-send")
    receiver = asyncio.create_task(receive, name=f"{name}-recv")
    try:
        await start()
        await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
        if ended is not None:
            await ended(receiver)
    finally:
        release()
        receiver.cancel()
        try:
            await asyncio.shield(close())
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(sender, 2.0)  # what was queued goes out, if it can
        finally:
            sender.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)
    return receiver
