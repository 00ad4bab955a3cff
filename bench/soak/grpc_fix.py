"""A patch of grpc.aio: keep the server's status when a client write fails."""

from __future__ import annotations

import asyncio
from typing import Any


def patch_grpc_write_status() -> bool:
    """Keep the server's status when a client write fails because the call just ended.

    grpc.aio (1.85 and older; grpc/grpc#36066, fix proposed in grpc/grpc#43486): when the
    server ends a bidi call before the client's write goes out (a RESOURCE_EXHAUSTED at
    admission, say), the failed write replaces the server's status with INTERNAL "Internal
    error from Core". This waits up to 5 s for the real status instead and keeps INTERNAL
    only where none comes (the hang that the INTERNAL was added for). Applied once per
    process; False (not applied) if this grpc's `_write` does not look as expected.
    """
    import inspect

    from grpc import _common
    from grpc._cython import cygrpc
    from grpc.aio import _call

    mixin = _call._StreamRequestMixin
    if getattr(mixin, "_soak_patched", False):
        return True
    try:
        src = inspect.getsource(mixin._write)
    except (OSError, TypeError):
        return False
    if "set_internal_error(str(err))" not in src or "send_serialized_message" not in src:
        return False

    async def _write(self: Any, request: Any) -> None:
        if self.done():
            raise asyncio.InvalidStateError(_call._RPC_ALREADY_FINISHED_DETAILS)
        if self._done_writing_flag:
            raise asyncio.InvalidStateError(_call._RPC_HALF_CLOSED_DETAILS)
        if not self._metadata_sent.is_set():
            await self._metadata_sent.wait()
            if self.done():
                await self._raise_for_status()
        serialized = _common.serialize(request, self._request_serializer)
        try:
            await self._cython_call.send_serialized_message(serialized)
        except cygrpc.InternalError as err:
            waiter = asyncio.ensure_future(self._cython_call.status())
            done, _ = await asyncio.wait([waiter], timeout=5.0)
            if not done:
                waiter.cancel()
                self._cython_call.set_internal_error(str(err))
            await self._raise_for_status()
        except asyncio.CancelledError:
            if not self.cancelled():
                self.cancel()
            raise

    mixin._write = _write
    mixin._soak_patched = True
    return True
