"""The agent's HTTP side: /metrics (Prometheus), /healthz and the WebSocket transport
GET /v1/talk with GET /v1/voices, the voices a conversation may ask for (talk/,
AGENT_WS_MAX_SESSIONS > 0), and the OpenAI Realtime API on GET /v1/realtime (realtime/,
the same keys and slots), on AGENT_HTTP_PORT.

/healthz answers 503 `{"status": "NOT_SERVING", "preparing": true}` until the talk route
has prepared what conversations share (`TalkHub.prepare`: the starter phrases, the
recogniser), then 200 `{"status": "SERVING", ...}` while the process runs and says whether
each backend's gRPC channel connects (`tts`, `thinker`, `degraded`: the agent keeps
sessions alive with a fallback when one is down, so a down backend is reported, not
fatal); `/healthz?strict=1` answers 503 `{"status": "NOT_SERVING", ...}` then, for a
readiness probe that should hold traffic until both backends are up. `status` always
matches the HTTP code, as in every service (CONTRIBUTING.md "Service shell").
`overloaded`: the process runs later than AGENT_ADMIT_MAX_LAG_MS (load.py), so /v1/talk
refuses new conversations; it does not change the status (those under way go on).

AGENT_PROCS > 1 (`serve_processes`): that many `serve-direct` processes on one port
(SO_REUSEPORT), the kernel hashing each connection to one of them; each admits its own
AGENT_WS_MAX_SESSIONS, so a caller hashed to a full process is refused `busy` even while
another has room (deploy/sizing.py sizes the slots with headroom for it; a retry comes
from a new port and hashes anew). /metrics sums every process (prometheus_client's
multiprocess mode: gauges by pid); /healthz answers for the process it reaches. The first
process to end ends them all, so the container restarts whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from .load import MONITOR
from .metrics import REGISTRY
from .settings import AgentSettings

log = logging.getLogger("voice_agent.http")
SETTINGS = web.AppKey("settings", AgentSettings)
# prometheus_client's own switch, set by `serve_processes` for its children before they
# import it: their metrics then live in files there, which any of them can sum.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


async def _reachable(addr: str, timeout_s: float = 0.5) -> bool:
    async with grpc.aio.insecure_channel(addr) as ch:
        try:
            await asyncio.wait_for(ch.channel_ready(), timeout_s)
            return True
        except (TimeoutError, grpc.aio.AioRpcError):
            return False


def _registry() -> CollectorRegistry:
    if not os.environ.get(MULTIPROC_DIR):
        return REGISTRY
    every = CollectorRegistry()
    MultiProcessCollector(every)
    return every


def make_app(settings: AgentSettings) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(_registry()),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(req: web.Request) -> web.Response:
        tts_ok, thinker_ok = await asyncio.gather(
            _reachable(settings.tts_addr), _reachable(settings.thinker_addr))
        ok = tts_ok and thinker_ok
        ready = hub is None or hub.ready.is_set()
        serving = ready and (ok or req.query.get("strict") != "1")
        return web.json_response(
            {"status": "SERVING" if serving else "NOT_SERVING", "tts": tts_ok,
             "thinker": thinker_ok, "degraded": not ok, "preparing": not ready,
             "overloaded": MONITOR.overloaded(settings.admit_max_lag_ms)},
            status=200 if serving else 503)

    app = web.Application()
    app[SETTINGS] = settings
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.on_startup.append(_watch_loop)
    hub = None
    if settings.ws_max_sessions > 0:
        from . import realtime
        from .talk import PATH, TALK_HUB, VOICES_PATH, TalkHub

        hub = app[TALK_HUB] = TalkHub(settings)
        app.router.add_get(PATH, hub.handle)
        # the OpenAI Realtime API, through the same door and slots as /v1/talk
        app.router.add_get(realtime.PATH, lambda req: realtime.handle(hub, req))
        app.router.add_get(VOICES_PATH, hub.voices)
        app.on_startup.append(hub.start)  # prepare() checks AGENT_TTS_VOICE too
        app.on_shutdown.append(hub.close_all)
    else:
        app.on_startup.append(_check_voice)
    return app


_CHECKS: set[asyncio.Task[object]] = set()


async def _watch_loop(_app: web.Application) -> None:
    MONITOR.watch()  # this loop's lag (load.py): agent_loop_lag_seconds, the admission


async def _check_voice(app: web.Application) -> None:
    """No talk route: AGENT_TTS_VOICE is still checked against the TTS's ListVoices, in
    the background (an error in the log naming the fix if the TTS has no such voice)."""
    from .voices import check_configured_voice

    task = asyncio.create_task(check_configured_voice(app[SETTINGS]))
    _CHECKS.add(task)
    task.add_done_callback(_CHECKS.discard)


async def start_http(settings: AgentSettings, reuse_port: bool = False) -> web.AppRunner:
    runner = web.AppRunner(make_app(settings), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.http_host, settings.http_port,
                      reuse_port=reuse_port).start()
    log.info("http on %s:%d (/metrics, /healthz%s)", settings.http_host, settings.http_port,
             ", /v1/talk, /v1/realtime, /v1/voices" if settings.ws_max_sessions else "")
    return runner


async def serve_forever(settings: AgentSettings, reuse_port: bool = False) -> None:
    """`serve-direct`: the HTTP side only, until SIGTERM/SIGINT (no LiveKit here): browsers
    converse over /v1/talk; AutoRTC drives sessions in-process through voice_agent.direct.
    `reuse_port`: one of `serve_processes`' children, sharing the port with its siblings."""
    runner = await start_http(settings, reuse_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("serve-direct: no LiveKit worker; /metrics, /healthz, /v1/talk until SIGTERM")
    await stop.wait()
    await runner.cleanup()


def serve_processes(settings: AgentSettings) -> int:
    """AGENT_PROCS `serve-direct` children on AGENT_HTTP_PORT, until SIGTERM/SIGINT or the
    first of them ends (then the others are stopped too); returns the exit status."""
    # SO_REUSEPORT would also let the children join another server's port: refuse a taken
    # one here first, with its name.
    family = socket.AF_INET6 if ":" in settings.http_host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((settings.http_host, settings.http_port))
        except OSError:
            raise SystemExit(f"voice-agent: cannot bind AGENT_HTTP_PORT={settings.http_port}: "
                             "is it taken?") from None
    with tempfile.TemporaryDirectory(prefix="agent-metrics-") as metrics_dir:
        env = {**os.environ, "AGENT_PROCS": "1", MULTIPROC_DIR: metrics_dir}
        cmd = [sys.executable, "-m", "voice_agent", "serve-direct", "--reuse-port"]
        procs = [subprocess.Popen(cmd, env=env) for _ in range(settings.procs)]
        stopping = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("serve-direct: %d processes on :%d (AGENT_PROCS), %d conversations each",
                 settings.procs, settings.http_port, settings.ws_max_sessions)
        while all(p.poll() is None for p in procs):
            time.sleep(0.2)
        first = next(p for p in procs if p.returncode is not None)
        if not stopping:
            log.error("serve-direct: process %d ended (status %s); stopping the others",
                      first.pid, first.returncode)
            stop()
        for p in procs:
            p.wait()
        return 0 if stopping else (first.returncode or 1)
