"""gRPC plumbing shared by our plugins: one channel per event loop, status -> APIError.

grpc.aio channels belong to the loop that made them, and a livekit worker may run
jobs on several loops (threads), so a channel is made lazily for the running loop.
gRPC codes become the framework's error types, so its retry logic applies: a 4xx-like
code (INVALID_ARGUMENT, NOT_FOUND) is never retried, UNAVAILABLE /
RESOURCE_EXHAUSTED are. Messages are re-raised `from None` (no transport internals).
"""

from __future__ import annotations

import asyncio

import grpc
from livekit.agents import APIConnectionError, APIStatusError, APITimeoutError

# gRPC code -> the HTTP-like status the framework's APIStatusError reasons about.
_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.DEADLINE_EXCEEDED: 408,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
}

# Keep the channel warm between turns (no reconnect on the first token of a turn).
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


class ChannelCache:
    """One insecure channel to `addr` per running event loop, and the metadata every call
    on it sends: the server's API key, if it asks for one (never logged)."""

    def __init__(self, addr: str, api_key: str = "") -> None:
        self.addr = addr
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._channels: dict[int, grpc.aio.Channel] = {}

    def get(self) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        ch = self._channels.get(id(loop))
        if ch is None:
            ch = grpc.aio.insecure_channel(self.addr, options=_CHANNEL_OPTIONS)
            self._channels[id(loop)] = ch
        return ch

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        ch = self._channels.pop(id(loop), None)
        if ch is not None:
            await ch.close()


def to_api_error(e: grpc.aio.AioRpcError, what: str) -> Exception:
    """The framework's error for a failed call (`raise to_api_error(e, ...) from None`)."""
    return status_error(e.code(), e.details(), what)


def status_error(code: grpc.StatusCode, details: str | None, what: str) -> Exception:
    msg = f"{what}: {code.name}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APITimeoutError(msg)
    if code == grpc.StatusCode.UNAVAILABLE:
        return APIConnectionError(msg)
    return APIStatusError(msg, status_code=_HTTP.get(code, 500), body=code.name)
