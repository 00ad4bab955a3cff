"""`python -m voice_token`: run the token service until SIGTERM/SIGINT.

Shutdown is graceful: stop accepting, let in-flight requests finish (aiohttp's
shutdown timeout), then exit 0. Configuration comes from the environment only (see
settings.py); the flags here are conveniences for a laptop run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from aiohttp import web

from voice_token.app import build_app
from voice_token.logs import setup_logging
from voice_token.settings import Settings, SettingsError, load_settings

log = logging.getLogger("voice_token")

EPILOG = """\
environment (see services/token/README.md):
  LIVEKIT_URL                  LiveKit URL given to browsers (default ws://localhost:7880);
                               empty: the page talks to the agent's WebSocket instead
  TOKEN_AGENT_WS_URL           that WebSocket (default ws://127.0.0.1:8003/v1/talk)
  LIVEKIT_API_KEY / _FILE      API key, or a file holding it (required with LiveKit)
  LIVEKIT_API_SECRET / _FILE   API secret, or a file holding it (required with LiveKit)
  TOKEN_HTTP_PORT              HTTP port (default 8080); TOKEN_HTTP_HOST (default 0.0.0.0)
  TOKEN_TTL_SECONDS            token lifetime, 60..86400 (default 600)
  TOKEN_CORS_ORIGINS           comma-separated origins allowed cross-origin, or *
  TOKEN_RATE_LIMIT_PER_MINUTE  per-client rate (default 30); TOKEN_RATE_LIMIT_BURST (10)
  TOKEN_TRUST_PROXY            take the client address from X-Forwarded-For (default false)
  TOKEN_PROXY_HOPS             trusted proxies in front (default 1): the address that many
                               from the right of X-Forwarded-For is the client's
  TOKEN_ISSUER_KEYS / _FILE    keys of the app's backend (Authorization: Bearer): any
                               room and identity; the file is re-read when it changes
  TOKEN_ROOMS                  room patterns open to callers without a key (default *)
  TOKEN_IDENTITIES             identity patterns they may have (default web-*)
  TOKEN_ANONYMOUS              false: tokens for key holders only (default true)
  TOKEN_AGENT_NAME             agent to dispatch into the room (default: none)
  TOKEN_CONNECT_TIMEOUT_SECONDS  page's wait for LiveKit before "cannot reach" (15)
  TOKEN_AGENT_TIMEOUT_SECONDS  page's wait, once connected, for an agent to answer (10)
  TOKEN_LOG_LEVEL              DEBUG, INFO, WARNING, ERROR (default INFO)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m voice_token",
        description="LiveKit token service and voice demo page "
                    "(/, /api/token, /healthz, /metrics).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", help="bind address (overrides TOKEN_HTTP_HOST)")
    p.add_argument("--port", type=int, help="HTTP port (overrides TOKEN_HTTP_PORT)")
    p.add_argument("--check-config", action="store_true",
                   help="print the resolved configuration (secrets masked) and exit")
    return p.parse_args(argv)


async def serve(settings: Settings) -> None:
    app = build_app(settings)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner, settings.token_http_host, settings.token_http_port, shutdown_timeout=5.0
    )
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else settings.token_http_port
    log.info("listening", extra={"host": settings.token_http_host, "port": port,
                                 "livekit_url": settings.livekit_url,
                                 "transport": settings.transport})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()
    log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {}
    if args.host is not None:
        overrides["token_http_host"] = args.host
    if args.port is not None:
        overrides["token_http_port"] = args.port
    # Logging before settings so a config error is itself a structured line too.
    setup_logging()
    try:
        settings = load_settings(**overrides)
    except SettingsError as e:
        log.error("configuration error", extra={"error": str(e)})
        print(f"voice_token: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.token_log_level)
    if args.check_config:
        print(json.dumps(settings.public_summary(), indent=2, default=str))
        return 0
    log.info("config", extra={"config": settings.public_summary()})
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
