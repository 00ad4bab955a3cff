"""The server's errors by domain kind, and the one table that turns a kind into each
protocol's answer: the gRPC status, the HTTP status and OpenAI error type, the WebSocket
close code (RFC 6455 / IANA: 1008 policy violation, 1013 try again later, 1012 service
restart, 1011 internal error).

A call (or a voice-library request) ends with one `CallError(kind, message)`; engine
errors get their kind in `status_for`. The fronts read `error.status` and nothing else.
Messages say what to fix, never echo more than a short prefix of input.
"""

from __future__ import annotations

from typing import NamedTuple

import grpc

from voice_tts.engine import EngineFailed, EngineFull, UnknownVoice


class Status(NamedTuple):
    grpc: grpc.StatusCode
    http: int
    openai: str  # OpenAI's error `type`
    ws: int  # WebSocket close code


_C = grpc.StatusCode
STATUS: dict[str, Status] = {
    "invalid": Status(_C.INVALID_ARGUMENT, 400, "invalid_request_error", 1008),
    "preset": Status(_C.INVALID_ARGUMENT, 400, "invalid_request_error", 1008),  # not deleted
    "not_found": Status(_C.NOT_FOUND, 404, "invalid_request_error", 1008),
    "exists": Status(_C.ALREADY_EXISTS, 409, "invalid_request_error", 1008),
    # A voice upload over the limit (413); for one call's inline audio it is "invalid".
    "too_large": Status(_C.RESOURCE_EXHAUSTED, 413, "invalid_request_error", 1013),
    # The library's disk is full: HTTP 507 Insufficient Storage (WebDAV's, the one status
    # that says it); gRPC has RESOURCE_EXHAUSTED for it and for "busy".
    "storage": Status(_C.RESOURCE_EXHAUSTED, 507, "server_error", 1013),
    # This checkpoint cannot do it (a clone without Base), or no TTS_VOICE_DIR.
    "unsupported": Status(_C.UNIMPLEMENTED, 501, "invalid_request_error", 1008),
    "busy": Status(_C.RESOURCE_EXHAUSTED, 429, "rate_limit_error", 1013),  # retry later
    "unavailable": Status(_C.UNAVAILABLE, 503, "server_error", 1012),  # draining, failed
    "io": Status(_C.INTERNAL, 500, "server_error", 1011),  # the directory cannot be written
    "internal": Status(_C.INTERNAL, 500, "server_error", 1011),
}


class CallError(Exception):
    """What a call (or a library request) ends with: a kind of `STATUS` and a message."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in STATUS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind, self.message = kind, message

    @property
    def status(self) -> Status:
        return STATUS[self.kind]

    @property
    def code(self) -> grpc.StatusCode:
        """Its gRPC status (`status.grpc`)."""
        return self.status.grpc


class VoiceError(CallError):
    """A voice-library request that cannot be done (`voice_library.py`)."""


def invalid(message: str) -> CallError:
    return CallError("invalid", message)


def status_for(exc: BaseException) -> CallError:
    """The error a failed call ends with, by the kind of what was raised."""
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, UnknownVoice):
        return CallError("not_found", str(exc))
    if isinstance(exc, EngineFailed):
        return CallError("unavailable", f"{exc}; the server is restarting, retry on another "
                         "replica")
    if isinstance(exc, EngineFull):
        return CallError("busy", str(exc) or "server at its session limit")
    if isinstance(exc, ValueError | UnicodeDecodeError):
        return invalid(str(exc))
    return CallError("internal", f"internal error ({type(exc).__name__}); see server logs")
