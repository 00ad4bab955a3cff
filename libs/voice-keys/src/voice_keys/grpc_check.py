"""The gRPC side of voice_keys: an interceptor that refuses calls without a valid key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from voice_keys import ApiKeys, bearer

# Health and reflection stay open: orchestrators and grpcurl probe without a key.
OPEN_GRPC = ("/grpc.health.v1.Health/", "/grpc.reflection.")


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
