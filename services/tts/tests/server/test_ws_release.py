"""A WebSocket session's objects are freed when it ends: the closed response, its request
and transport. aiohttp (since aio-libs/aiohttp#12030) re-arms the heartbeat when the
client's CLOSE frame arrives after `close()` cancelled it; that 20 s timer (then a 10 s
pong wait) held every closed session ~30 s, ~750 at once at 500 sessions a 20 s round
(services/tts/README.md, "Memory"). `ws_speech._WebSocket` keeps it off. The handler runs
in-process over a stand-in call (the end-to-end WebSocket tests are test_ws_speech.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from voice_tts.server.fronts.ws_speech import WS_PATH, SpeechSocket

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class StandInCalls:
    """`Synthesis.call` reduced to reading the requests to their end (no audio)."""

    @contextlib.asynccontextmanager
    async def call(self, protocol: str, requests: AsyncIterator[object]
                   ) -> AsyncIterator[AsyncIterator[object]]:
        async def responses() -> AsyncIterator[object]:
            async for _ in requests:
                pass
            return
            yield

        yield responses()


async def test_closed_sessions_are_freed_at_once() -> None:
    held: list[weakref.ref] = []

    @web.middleware
    async def keep(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        held.append(weakref.ref(response))
        return response

    app = web.Application(middlewares=[keep])
    SpeechSocket(StandInCalls()).add_routes(app)  # type: ignore[arg-type]
    async with TestServer(app) as server, aiohttp.ClientSession() as client:
        async def session() -> None:
            async with client.ws_connect(server.make_url(WS_PATH)) as ws:
                await ws.send_str(json.dumps({"type": "config", "voice": "x"}))
                await ws.send_str(json.dumps({"type": "end"}))
                async for _ in ws:
                    pass
                assert ws.close_code == 1000

        await asyncio.gather(*(session() for _ in range(20)))
        for _ in range(20):  # the handlers' last turns (the heartbeat re-armed in one)
            await asyncio.sleep(0.01)
        gc.collect()
        assert len(held) == 20
        alive = [r() for r in held if r() is not None]
        assert not alive, (f"{len(alive)} of 20 closed WebSocket sessions still held "
                           f"(heartbeat timer: {alive[0]._heartbeat_cb})")
