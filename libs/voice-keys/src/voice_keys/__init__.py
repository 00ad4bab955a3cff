"""API keys: who may use a server of the voice stack (off when no key is configured).

One module for every server that checks keys (the TTS, the thinker, the agent's
WebSocket). Keys come from `<PREFIX>_API_KEYS` (comma-separated) and/or
`<PREFIX>_API_KEYS_FILE` (one per line, `#` comments): the file is read again when it
changes, so keys rotate without a restart (add the new key, move clients over, remove the
old one). A caller shows one as `authorization: Bearer <key>` (gRPC metadata, or the HTTP
header the `openai` SDK sends as `api_key`). A missing or wrong key is UNAUTHENTICATED /
401 with a message that never holds a key; keys are compared in constant time. The gRPC
interceptor is `voice_keys.grpc_check.GrpcKeyCheck` (this module needs no grpcio).
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

__all__ = ["ApiKeys", "bearer"]

log = logging.getLogger("voice_keys")


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
