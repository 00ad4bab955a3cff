"""API keys: who may use a server of the voice stack (off when no key is configured).

One module for every server that checks keys (the TTS, the thinker, the agent's
WebSocket). Keys come from `<PREFIX>_API_KEYS` (comma-separated) and/or
`<PREFIX>_API_KEYS_FILE` (one per line, `#` comments): the file is read again when it
changes, so keys rotate without a restart (add the new key, move clients over, remove the
old one). A caller shows one as `authorization: Bearer <key>` (gRPC metadata, or the HTTP
header the `openai` SDK sends as `api_key`). A missing or wrong key is UNAUTHENTICATED /
401 with a message that never holds a key; keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

__all__ = ["OPEN_GRPC", "ApiKeys", "GrpcKeyCheck", "bearer"]

log = logging.getLogger("voice_keys")

# Health and reflection stay open: orchestrators and grpcurl probe without a key.
OPEN_GRPC = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class ApiKeys:
    """The accepted keys: inline ones and those of a file, re-read when it changes."""

    def __init__(self, keys: str = "", path: Path | None = None, *,
                 file_setting: str = "API_KEYS_FILE", how: str = "") -> None:
        self._inline = {k.strip() for k in keys.split(",") if k.strip()}
        self._path = path
        self._file_setting = file_setting
        self._how = how or "send `Authorization: Bearer <key>`"
        self._mtime: int | None = None
        self._from_file: set[str] = set()
        self._reload()

    @property
    def enabled(self) -> bool:
        return bool(self._inline) or self._path is not None

    def _reload(self) -> None:
        if self._path is None:
            return
        try:
            mtime = os.stat(self._path).st_mtime_ns
        except OSError as e:  # keep the last good set: a rotation mid-write is not an outage
            if self._mtime is None:
                raise SystemExit(f"{self._file_setting}={self._path}: cannot read "
                                 f"({e.strerror})") from None
            return
        if mtime == self._mtime:
            return
        lines = self._path.read_text().splitlines()
        self._from_file = {ln.strip() for ln in lines if ln.strip() and
                           not ln.lstrip().startswith("#")}
        self._mtime = mtime
        log.info("API keys loaded: %d from the file, %d inline", len(self._from_file),
                 len(self._inline))

    def allows(self, presented: str | None) -> bool:
        """True for a configured key (compared in constant time) or when keys are off."""
        if not self.enabled:
            return True
        if not presented:
            return False
        self._reload()
        given = presented.encode()
        return any(hmac.compare_digest(given, k.encode())
                   for k in self._inline | self._from_file)

    def refusal(self, presented: str | None) -> str:
        return (f"missing API key: {self._how}" if not presented
                else "invalid API key (it is not one this server accepts)")


def bearer(value: str | None) -> str | None:
    """The key in an `Authorization: Bearer <key>` value (None if it is not one)."""
    if not value:
        return None
    scheme, _, key = value.strip().partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


class GrpcKeyCheck(grpc.aio.ServerInterceptor):
    """Refuses a call without a valid key before its handler runs (or reads a message).

    `drain` (for client-streaming methods) reads the client's writes before the status
    goes out: a status racing a write in flight reaches a grpc.aio client as INTERNAL.
    """

    def __init__(self, keys: ApiKeys,
                 drain: Callable[[AsyncIterator[Any]], Awaitable[None]] | None = None) -> None:
        self.keys, self.drain = keys, drain

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_GRPC):
            return handler
        meta = dict(details.invocation_metadata or ())
        key = bearer(meta.get("authorization"))
        if self.keys.allows(key):
            return handler
        message = self.keys.refusal(key)

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            if handler.request_streaming and self.drain is not None:
                await self.drain(request)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        async def refuse_stream(request: Any, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
            await refuse(request, context)
            yield  # a generator, as a streaming handler is

        kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
                 (True, False): grpc.stream_unary_rpc_method_handler,
                 (False, True): grpc.unary_stream_rpc_method_handler,
                 (True, True): grpc.stream_stream_rpc_method_handler}
        make = kinds[(handler.request_streaming, handler.response_streaming)]
        return make(refuse_stream if handler.response_streaming else refuse,
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
