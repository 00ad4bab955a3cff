"""Every environment variable the token service reads, in one place.

Field names are the env var names (case-insensitive, no prefix): the service shares
`LIVEKIT_*` with the agent and owns `TOKEN_*`. `load_settings()` is the only entry point:
it turns pydantic's errors into one clear `SettingsError` that names the variable and
never carries its value (pydantic's own messages echo the input, which could be the
API secret).

The API key and secret come from `LIVEKIT_API_KEY` / `LIVEKIT_API_SECRET` or from files
named by `LIVEKIT_API_KEY_FILE` / `LIVEKIT_API_SECRET_FILE` (Docker/K8s secrets), never
from the command line, and are kept as `SecretStr` so that a repr or a log line shows
`**********`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class SettingsError(ValueError):
    """A bad or missing setting; the message says which variable and how to fix it."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    # Port of the HTTP server (page, /api/token, /healthz, /metrics).
    token_http_port: int = Field(8080, ge=0, le=65535)
    # Interface to bind; 0.0.0.0 in a container, 127.0.0.1 for a laptop-only demo.
    token_http_host: str = "0.0.0.0"
    # LiveKit URL handed to BROWSERS (ws:// or wss://), so it must be reachable from them;
    # in compose that is the published port, not the internal service name. Empty: no
    # LiveKit; the page talks to the agent over its WebSocket (TOKEN_AGENT_WS_URL).
    livekit_url: str = "ws://localhost:7880"
    # The agent's WebSocket transport (GET /v1/talk on AGENT_HTTP_PORT), handed to
    # browsers when LIVEKIT_URL is empty (the local mesh).
    token_agent_ws_url: str = "ws://127.0.0.1:8003/v1/talk"
    # API key / secret that sign the tokens (must match the LiveKit server's keys).
    livekit_api_key: SecretStr | None = None
    livekit_api_secret: SecretStr | None = None
    # Alternatively, files holding them (one value, trailing newline ignored).
    livekit_api_key_file: Path | None = None
    livekit_api_secret_file: Path | None = None
    # Lifetime of a participant token. LiveKit checks it only at join time, so short is
    # fine: a call that started keeps going after the token expires.
    token_ttl_seconds: int = Field(600, ge=60, le=86_400)
    # Comma-separated origins allowed to call /api/token cross-origin ("*" = any).
    # The page itself is same-origin and needs nothing here.
    token_cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Token-bucket rate limit per client address: sustained rate and burst size.
    token_rate_limit_per_minute: int = Field(30, ge=1, le=100_000)
    token_rate_limit_burst: int = Field(10, ge=1, le=100_000)
    # Take the client address from X-Forwarded-For (only behind a trusted proxy, else
    # any client could pick its own rate-limit bucket).
    token_trust_proxy: bool = False
    # How many trusted proxies stand in front, each appending the address it saw: the
    # client is the entry that many from the right (what the client itself wrote, on
    # the left, is never taken).
    token_proxy_hops: int = Field(1, ge=1, le=16)
    # Who gets which token (grants.py). A caller showing a key of TOKEN_ISSUER_KEYS /
    # TOKEN_ISSUER_KEYS_FILE (`Authorization: Bearer`: the app's backend) may have any
    # room and identity; anyone else only rooms and identities matching these patterns
    # (`*` any run of characters), or nothing at all with TOKEN_ANONYMOUS=false.
    token_rooms: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["*"])
    token_identities: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["web-*"])
    token_anonymous: bool = True
    token_issuer_keys: SecretStr = SecretStr("")
    token_issuer_keys_file: Path | None = None
    # Agent to dispatch explicitly into the room when the token is used; empty = none
    # (an agent registered without a name joins every room on its own).
    token_agent_name: str = Field("", max_length=128)
    # How long the page waits for the LiveKit server before showing "cannot reach server".
    token_connect_timeout_seconds: float = Field(15.0, gt=0, le=120)
    # How long the page, once connected, waits for an agent to answer (LiveKit: join the
    # room; WebSocket: say "ready") before showing "No agent answered".
    token_agent_timeout_seconds: float = Field(10.0, gt=0, le=300)
    # Log level of the JSON logs (DEBUG, INFO, WARNING, ERROR).
    token_log_level: str = "INFO"

    @field_validator("livekit_url", "token_agent_ws_url")
    @classmethod
    def _ws_url(cls, v: str) -> str:
        if not v.strip():
            return ""
        parts = urlsplit(v)
        if parts.scheme not in ("ws", "wss", "http", "https") or not parts.netloc:
            raise ValueError("must be a ws:// or wss:// URL such as ws://localhost:7880")
        return v.rstrip("/")

    @field_validator("token_cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, v: object) -> object:
        if isinstance(v, str):
            v = [o.strip() for o in v.split(",") if o.strip()]
        if isinstance(v, list):
            out = []
            for o in v:
                o = str(o).rstrip("/").lower()
                parts = urlsplit(o)
                if o != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                                 or parts.path or parts.query):
                    raise ValueError(
                        f"{o!r} is not an origin; use scheme://host[:port], e.g. "
                        "https://voice.example.com, or *"
                    )
                out.append(o)
            return out
        return v

    @field_validator("token_rooms", "token_identities", mode="before")
    @classmethod
    def _split_patterns(cls, v: object) -> object:
        if isinstance(v, str):
            v = [p.strip() for p in v.split(",") if p.strip()]
        if isinstance(v, list):
            for p in v:
                if not _PATTERN_RE.fullmatch(str(p)):
                    raise ValueError(
                        f"{str(p)[:40]!r} is not a name pattern: letters, digits, '.', '_', "
                        "'-' and '*' (any run of characters), at most 64")
        return v

    @field_validator("token_log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")
        return v

    @property
    def transport(self) -> str:
        """What the page uses: "livekit" (WebRTC) or "websocket" (the agent, no LiveKit)."""
        return "livekit" if self.livekit_url else "websocket"

    def credentials(self) -> tuple[str, str]:
        """(api_key, api_secret), from the env or the files; SettingsError if missing."""
        key = _one_source("LIVEKIT_API_KEY", self.livekit_api_key, self.livekit_api_key_file)
        secret = _one_source(
            "LIVEKIT_API_SECRET", self.livekit_api_secret, self.livekit_api_secret_file
        )
        if len(secret) < MIN_SECRET_CHARS:
            # a short HMAC key can be guessed offline from one token
            raise SettingsError(
                f"LIVEKIT_API_SECRET is {len(secret)} characters; use {MIN_SECRET_CHARS} or "
                "more (openssl rand -hex 32), the same in LiveKit's keys")
        return key, secret

    def public_summary(self) -> dict[str, object]:
        """The settings for a log line or --check-config: secrets shown only as set/unset."""
        out: dict[str, object] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "<set>"
            elif "api_" in name:
                value = str(value) if value is not None else None
            out[name.upper()] = value
        return out


_PATTERN_RE = re.compile(r"[A-Za-z0-9._*-]{1,64}")
# LiveKit's own rule for API secrets; HS256 wants a key as long as its 32-byte hash.
MIN_SECRET_CHARS = 32
# .env.example's secret: public, so anyone could sign tokens with it.
EXAMPLE_SECRET = "secret-change-me-0123456789abcdef"


def _one_source(var: str, value: SecretStr | None, path: Path | None) -> str:
    if value is not None and path is not None:
        raise SettingsError(f"both {var} and {var}_FILE are set; set only one")
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError as e:
            # strerror only: the path is ours to show, the content never is.
            raise SettingsError(f"{var}_FILE={path}: cannot read ({e.strerror})") from None
        if not text:
            raise SettingsError(f"{var}_FILE={path}: the file is empty")
        return text
    if value is None or not value.get_secret_value().strip():
        raise SettingsError(f"{var} (or {var}_FILE) is required to sign tokens")
    return value.get_secret_value().strip()


def load_settings(**overrides: object) -> Settings:
    """Read the env (plus explicit overrides); fail fast with a clear, secret-free message."""
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        lines = []
        for err in e.errors(include_input=False, include_url=False):
            var = ".".join(str(p) for p in err["loc"]).upper() or "settings"
            lines.append(f"{var}: {err['msg']}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    if settings.transport == "livekit":
        settings.credentials()  # fail at start-up, not at the first request
    elif not settings.token_agent_ws_url:
        raise SettingsError("invalid configuration:\n  LIVEKIT_URL and TOKEN_AGENT_WS_URL "
                            "are both empty; set one (LiveKit, or the agent's WebSocket)")
    return settings
