"""Error kinds of the thinker, and the one table that maps them to gRPC status codes.

Code anywhere below the servicer raises these (or ValueError); only `status_for` knows
about gRPC. Anything unexpected is INTERNAL with a generic message: backend exceptions
can carry paths and prompts, so their text is logged, not sent.
"""

from __future__ import annotations

import grpc


class InvalidInput(ValueError):
    """The request is malformed or over a limit; the message tells the client which."""


class AudioNotSupported(InvalidInput):
    """Audio parts sent to a text-only model with no ASR step configured."""


class Overloaded(Exception):
    """At the concurrent-request limit: reject, never degrade everyone."""


class Draining(Exception):
    """The server is shutting down and takes no new calls."""


class NotReady(Exception):
    """The model is still loading (health NOT_SERVING): retry shortly."""


class Aborted(Exception):
    """The server aborted a generation the client was still reading (drain, shutdown)."""


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error (device-side assert, illegal address, ...): the process's CUDA context
    is poisoned, every later call on it fails; only a restart recovers."""
    text = str(exc)
    return type(exc).__name__ == "AcceleratorError" or (
        isinstance(exc, RuntimeError)
        and ("CUDA error" in text or "device-side assert" in text))


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, Aborted):
        return grpc.StatusCode.ABORTED, str(exc)
    if isinstance(exc, Draining | NotReady):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if is_device_fault(exc):
        return grpc.StatusCode.UNAVAILABLE, ("thinker device fault; the server is restarting, "
                                             "retry on another instance")
    return grpc.StatusCode.INTERNAL, "internal error in the thinker (see its log)"
