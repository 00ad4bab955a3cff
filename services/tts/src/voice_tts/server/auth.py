"""API keys: who may use the TTS (off when no key is configured).

Keys come from `TTS_API_KEYS` (comma-separated) and/or `TTS_API_KEYS_FILE` (one per
line, `#` comments): the file is read again when it changes, so keys rotate without a
restart (add the new key, move clients over, remove the old one). A caller shows one:
- gRPC: metadata `authorization: Bearer <key>` (every method but health and reflection);
- HTTP: header `Authorization: Bearer <key>` (what the `openai` SDK sends as `api_key`);
- WebSocket: the same header, or `?api_key=<key>` for browsers, which cannot set headers
  on a WebSocket.
`/healthz` and `/metrics` stay open (orchestrators and Prometheus). A missing or wrong
key is UNAUTHENTICATED / 401, with a message that never holds a key.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from voice_tts.server.synthesis import until_client_stops_writing

log = logging.getLogger("voice_tts.auth")

OPEN_GRPC = ("/grpc.health.v1.Health/", "/grpc.reflection.")
OPEN_HTTP = ("/healthz", "/metrics")
HOW = ("send `authorization: Bearer <key>` (gRPC metadata; the HTTP header; or "
       "?api_key=<key> on the WebSocket)")


class ApiKeys:
    def __init__(self, keys: str = "", path: Path | None = None) -> None:
        self._inline = {k.strip() for k in keys.split(",") if k.strip()}
        self._path = path
        self._mtime: float | None = None
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
                raise SystemExit(f"TTS_API_KEYS_FILE={self._path}: cannot read "
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
        return (f"missing API key: {HOW}" if not presented
                else "invalid API key (it is not one this server accepts)")


def bearer(value: str | None) -> str | None:
    """The key in an `Authorization: Bearer <key>` value (None if it is not one)."""
    if not value:
        return None
    scheme, _, key = value.strip().partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


class GrpcKeyCheck(grpc.aio.ServerInterceptor):
    """Refuses a call without a valid key before its handler runs (or reads a message)."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

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
            if handler.request_streaming:  # answered once its writes end (as admission)
                await until_client_stops_writing(request)
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
