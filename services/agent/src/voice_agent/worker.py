"""The LiveKit worker: registers with the server, joins rooms on dispatch, converses.

LIVEKIT_URL / LIVEKIT_API_KEY / LIVEKIT_API_SECRET locate the server; with
AGENT_AGENT_NAME empty the worker takes automatic dispatch (every new room), else
only explicit dispatch to that name. Jobs run as threads of this process
(JobExecutorType.THREAD) so that the Prometheus registry served on AGENT_HTTP_PORT
sees every session's metrics; each job has its own event loop and gRPC channels.

Per session: the pipeline of `agent.py` on the room's tracks (RoomIO, with the
framework's transcript synchronizer, which is what records an interrupted reply as
far as it was heard), the duplex controller, and one data message per turn on topic
AGENT_LATENCY_TOPIC ("latency"): `marks.LatencyRecord` {"trace_id", "eot_to_first_audio_ms",
"llm_ttft_ms", "tts_ttfa_ms"} for the web page; and AutoRTC's acks and reply marks
(`autortc_marks`, wire format in `marks`).

No LiveKit server runs on the build machines: this module is exercised by hand
against a real server (see README), the pipeline under it by the direct-mode tests.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

from livekit.agents import AgentServer, JobContext, JobExecutorType, JobProcess, cli

from .agent import PhraseCache, starter_phrases
from .autortc_marks import AutoRTCMarks
from .conversation.core import Conversation
from .conversation.parts import load_vad
from .http import start_http
from .load import MONITOR
from .marks import encode_latency
from .metrics import TurnTracker
from .settings import AgentSettings, load_settings
from .warmup import warm_transcript_timing

log = logging.getLogger("voice_agent.worker")

_CACHE = PhraseCache()  # one per process: the greeting/fallback audio is the same for all


def _prewarm(proc: JobProcess) -> None:
    load_vad(load_settings())  # the ONNX session, once per process
    warm_transcript_timing()  # else built on the loop during the first reply


async def entrypoint(ctx: JobContext) -> None:
    settings = load_settings()
    loop = asyncio.get_running_loop()
    sampler = MONITOR.watch()  # this job's loop lag (load.py)

    async def _stop_sampler() -> None:
        sampler.cancel()

    ctx.add_shutdown_callback(_stop_sampler)

    pending: set[asyncio.Task[None]] = set()

    def send(payload: bytes, topic: str) -> None:
        async def _send() -> None:
            try:
                await ctx.room.local_participant.publish_data(payload, reliable=True,
                                                              topic=topic)
            except Exception as e:  # a lost data message must not break the call
                log.warning("data message on %s not sent: %s", topic, e)

        task = loop.create_task(_send())
        pending.add(task)
        task.add_done_callback(pending.discard)

    tracker = TurnTracker(on_report=lambda report: send(encode_latency(report),
                                                        settings.latency_topic))
    conv = Conversation(settings, tracker=tracker, cache=_CACHE)  # the room's tracks
    p = conv.pipeline
    marks = AutoRTCMarks(send, lambda: tracker.current.trace_id if tracker.current else None)
    ctx.room.on("data_received", lambda packet: marks.on_data(packet.topic, packet.data))
    p.session.on("agent_state_changed", lambda ev: marks.on_state(ev.old_state, ev.new_state))
    await ctx.connect()
    log.info("joined room %s; stt: %s", ctx.room.name, p.stt.describe())
    warm_stt = asyncio.ensure_future(p.stt.prewarm_async())
    if settings.starter_cache:
        await _CACHE.warm(p.tts, starter_phrases(settings), timeout_s=10.0)
    await warm_stt
    await conv.start(room=ctx.room)


def _serve_http(settings: AgentSettings) -> None:
    """/metrics and /healthz on their own loop in a daemon thread (the worker owns main)."""
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start_http(settings))
        loop.run_forever()

    threading.Thread(target=run, name="agent-http", daemon=True).start()


def run_worker(settings: AgentSettings, cli_args: list[str]) -> None:
    settings.require_livekit()
    if settings.http_port:
        _serve_http(settings)
    server = AgentServer(
        ws_url=settings.livekit_url, api_key=settings.livekit_api_key,
        api_secret=settings.livekit_api_secret, setup_fnc=_prewarm,
        job_executor_type=JobExecutorType.THREAD,
    )
    server.rtc_session(entrypoint, agent_name=settings.agent_name)
    # the framework's CLI parses argv: "start" (production) unless told otherwise
    sys.argv = [sys.argv[0], *(cli_args or ["start"])]
    cli.run_app(server)
