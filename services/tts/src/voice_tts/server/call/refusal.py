"""Turning a streaming call away without racing the client's writes (no heavy imports:
the gRPC front processes use it too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# A call turned away before its stream starts is answered once the client has stopped
# writing: at its half-close, after this long without a message, or at most this long.
REFUSAL_QUIET_S = 0.15
REFUSAL_MAX_WAIT_S = 0.5


async def until_client_stops_writing(it: AsyncIterator[object]) -> None:
    """Reads and drops the client's messages until it half-closes or goes quiet
    (`REFUSAL_QUIET_S`), at most `REFUSAL_MAX_WAIT_S`. A call turned away before its
    stream starts is answered only then: a status that races a client's write in flight
    reaches a grpc.aio client as INTERNAL "Internal error from Core" instead (its failed
    write overwrites the status, grpc/grpc#36066), and it would not retry elsewhere. Most
    clients write config, text, FLUSH and half-close at once: they get the status right
    after."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REFUSAL_MAX_WAIT_S
    with contextlib.suppress(Exception):  # the end, a timeout, garbage: all mean stop
        while (left := deadline - loop.time()) > 0:
            await asyncio.wait_for(anext(it), min(REFUSAL_QUIET_S, left))
