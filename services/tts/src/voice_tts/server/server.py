"""Assembles and runs the TTS service: engine, gRPC (TTS + health + reflection), HTTP
(metrics, health, OpenAI-style speech, the speech WebSocket).

Start-up order matters to orchestrators: health says SERVING only after the engine has
loaded and warmed up. SIGTERM drains: health goes NOT_SERVING, new calls get
UNAVAILABLE, in-flight utterances get `drain_timeout_s` to finish, calls still open then
end with UNAVAILABLE ("server drained"), and the process exits.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import torch
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from voice.tts.v1 import tts_pb2
from voice_keys import ApiKeys

from voice_tts.engine import Engine, EngineSettings
from voice_tts.engine.engine_set import EngineSet
from voice_tts.server.call.synthesis import Synthesis
from voice_tts.server.fronts.front_link import FrontProcs
from voice_tts.server.fronts.grpc_front import grpc_server
from voice_tts.server.fronts.http import start_http
from voice_tts.server.fronts.service import SERVICE_NAME, TextToSpeechServicer
from voice_tts.server.metrics import TTSMetrics
from voice_tts.server.voices.voice_library import VoiceLibrary
from voice_tts.settings import TTSSettings

log = logging.getLogger("voice_tts.server")
# The exit status after a fatal engine fault (the orchestrator restarts the process).
EXIT_ENGINE_FAULT = 3


def load_engine(settings: TTSSettings) -> Engine | EngineSet:
    """The engine the settings name: a checkpoint directory or a random-weight preset; or
    several, comma-separated (one of each kind: presets, clones, designs), as one."""
    models = [m.strip() for m in settings.model.split(",") if m.strip()]
    if len(models) > 1:
        engines = []
        for m in models:
            t0 = time.monotonic()
            engines.append(load_engine(settings.model_copy(update={"model": m})))
            log.info("loaded %s (%s) in %.1f s", engines[-1].model_name,
                     engines[-1].model_type, time.monotonic() - t0)
        return EngineSet(engines)
    es = EngineSettings(max_sessions=settings.max_sessions,
                        max_batch=min(settings.max_batch, settings.max_sessions),
                        max_seq_len=settings.max_seq_len,
                        max_prefills_per_step=settings.max_prefills,
                        first_step_apart_max_rows=settings.first_step_apart_max_rows,
                        first_packet_frames=settings.first_packet_frames,
                        packet_frames=settings.packet_frames,
                        decoder_precision=(settings.decoder_precision
                                           if settings.device.startswith("cuda") else "fp32"),
                        fault=settings.test_fault or None)
    dtype = None if settings.dtype == "auto" else getattr(torch, settings.dtype)
    if settings.model.startswith("preset:"):
        name = settings.model.removeprefix("preset:")
        log.warning("TTS_MODEL=%s: RANDOM WEIGHTS, the audio is noise. Set TTS_MODEL to a "
                    "Qwen3-TTS-12Hz checkpoint directory for speech.", settings.model)
        return Engine.from_preset(name, seed=settings.preset_seed, device=settings.device,
                                  dtype=dtype, settings=es)
    return Engine.from_pretrained(settings.model, device=settings.device, dtype=dtype,
                                  settings=es)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    calls: Synthesis  # every protocol's synthesis calls
    health: health.aio.HealthServicer
    grpc_port: int
    http_runner: object | None
    serving: bool = False
    failed: asyncio.Event = field(default_factory=asyncio.Event)  # fatal engine fault
    watchdog: asyncio.Task | None = None
    fronts: FrontProcs | None = None  # TTS_FRONT_PROCS: the processes serving gRPC

    async def set_health(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        if self.fronts is not None:
            self.fronts.set_serving(serving)

    async def fail(self, message: str) -> None:
        """The engine cannot go on (faults.py): NOT_SERVING at once, every call ends
        with UNAVAILABLE, and `serve` exits the process for the orchestrator to restart."""
        if self.failed.is_set():
            return
        self.failed.set()
        self.serving = False  # /healthz: 503
        n = self.calls.fail(message)
        log.critical("%s; %d call(s) end with UNAVAILABLE", message, n)
        await self.set_health(False)

    async def exit_after_fault(self) -> None:
        """Let the calls' UNAVAILABLE go out (briefly), then end the process, non-zero.
        No orderly shutdown: the CUDA context is broken, and its teardown can hang."""
        deadline = time.monotonic() + 2.0
        while self.calls.active and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # the statuses leave the transport (stop cancels calls)
        await self.server.stop(grace=1.0)
        log.critical("exiting with status %d after a fatal fault", EXIT_ENGINE_FAULT)
        logging.shutdown()
        os._exit(EXIT_ENGINE_FAULT)

    async def drain(self, timeout: float) -> None:
        """Stop accepting, let in-flight calls finish (bounded), then stop."""
        self.calls.draining = True
        self.calls.hurry()  # paced audio goes out now: utterances end within the timeout
        self.serving = False
        await self.set_health(False)
        deadline = time.monotonic() + timeout
        while self.calls.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.calls.active:
            n = self.calls.cut_open_calls()
            log.info("drain timeout: %d call(s) still open end with UNAVAILABLE", n)
            deadline = time.monotonic() + 1.0  # for their status to go out
            while self.calls.active and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        log.info("drained")
        if self.fronts is not None:
            await self.fronts.stop()
        await self.server.stop(grace=0.5)
        if self.http_runner is not None:
            await self.http_runner.cleanup()  # type: ignore[attr-defined]
        self.calls.engine.shutdown()


async def start_server(settings: TTSSettings, engine: Engine | EngineSet | None = None
                       ) -> RunningServer:
    """Load (or take) the engine, start it, serve gRPC and HTTP, then say SERVING."""
    engine = engine or load_engine(settings)
    metrics = _server_metrics(settings, engine)
    calls, library = _synthesis(settings, engine, metrics)
    _start_engine(engine, metrics, calls)
    server, keys = grpc_server(settings, reuseport=False)
    handler, health_servicer = _add_grpc_services(server, calls, library)
    loop = asyncio.get_running_loop()
    fronts, port = await _serve_grpc(settings, server, handler,
                                     lambda msg: loop.create_task(running.fail(msg)))
    _freeze_heap()
    running = RunningServer(server, calls, health_servicer, port, None, fronts=fronts)
    if settings.http_port:
        running.http_runner = await _serve_http(settings, metrics, running, keys, library)
    _watch_faults(running, engine, settings.engine_stall_s)
    running.serving = True
    await running.set_health(True)
    log.info("TTS serving on :%d (gRPC), :%d (HTTP) model=%s device=%s max_sessions=%d "
             "api_keys=%s", port, settings.http_port, engine.model_name, settings.device,
             settings.max_sessions, "required" if keys.enabled else "off")
    return running


def _server_metrics(settings: TTSSettings, engine: Engine | EngineSet) -> TTSMetrics:
    """The server's metrics, with what this server runs as `tts_server_info`."""
    metrics = TTSMetrics()
    metrics.server_info.info({
        "model": engine.model_name, "device": str(engine.device),
        "max_sessions": str(settings.max_sessions), "max_seq_len": str(settings.max_seq_len),
        "front_procs": str(settings.front_procs), "log_level": settings.log_level,
        "pace_lead_s": f"{settings.pace_lead_s:g}",
        "admit_frame_budget_ms": f"{settings.admit_frame_budget_ms:g}",
        "first_step_apart_max_rows": str(settings.first_step_apart_max_rows)})
    return metrics


def _synthesis(settings: TTSSettings, engine: Engine | EngineSet, metrics: TTSMetrics
               ) -> tuple[Synthesis, VoiceLibrary]:
    """The calls and the voice library, ready before the engine's first step."""
    calls = Synthesis(engine, settings, metrics)  # before the first step
    library = VoiceLibrary(engine, settings.voice_dir, settings.voice_max_upload_bytes,
                           metrics=metrics)
    library.load()  # stored voices are there before the first call
    library.start_watching(settings.voice_rescan_s)  # replicas sharing the directory
    calls.library = library
    # Capacity before any traffic: the warm-up's step time per batch bucket (GPU).
    calls.admission.model.seed(engine.bucket_step_ms)
    return calls, library


def _start_engine(engine: Engine | EngineSet, metrics: TTSMetrics, calls: Synthesis) -> None:
    """Start the engine's loop, each step feeding the metrics and admission's model."""
    gpu_sampled = [0.0]  # last tts_gpu_memory_bytes update (monotonic s)

    def sample_gpu_memory() -> None:
        if engine.device.type == "cuda":
            gpu_sampled[0] = time.monotonic()
            metrics.gpu_memory.labels("allocated").set(torch.cuda.memory_allocated(engine.device))
            metrics.gpu_memory.labels("reserved").set(torch.cuda.memory_reserved(engine.device))

    def on_step(stats: object) -> None:  # called from the engine thread
        metrics.step_seconds.observe(stats.step_ms / 1e3)  # type: ignore[attr-defined]
        metrics.batch_size.observe(stats.batch_size)  # type: ignore[attr-defined]
        calls.admission.model.observe(stats)  # admission's capacity model learns
        if time.monotonic() - gpu_sampled[0] >= 0.5:
            sample_gpu_memory()

    engine.on_step = on_step
    sample_gpu_memory()
    engine.start()


def _add_grpc_services(server: grpc.aio.Server, calls: Synthesis, library: VoiceLibrary
                       ) -> tuple[grpc.GenericRpcHandler, health.aio.HealthServicer]:
    """TTS, health and reflection on `server`; the TTS handler serves the fronts too."""
    handler = TextToSpeechServicer(calls, library).handler()  # this server's and the fronts'
    server.add_generic_rpc_handlers([handler])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    _ = tts_pb2.DESCRIPTOR  # registers the file descriptor that reflection serves
    return handler, health_servicer


async def _serve_grpc(settings: TTSSettings, server: grpc.aio.Server,
                      handler: grpc.GenericRpcHandler, on_front_lost: Callable[[str], None]
                      ) -> tuple[FrontProcs | None, int]:
    """Bind and start gRPC: on TTS_GRPC_PORT, or privately behind the TTS_FRONT_PROCS
    fronts (then started on it); the port the clients use."""
    fronts = None
    if settings.front_procs:
        if not settings.grpc_port:
            raise RuntimeError("TTS_FRONT_PROCS needs a fixed TTS_GRPC_PORT, not 0")
        fronts = FrontProcs(settings, handler, on_front_lost)
        # this process's own gRPC server: private (its handlers run the fronts' calls)
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC port {settings.grpc_port} (TTS_GRPC_PORT): "
                           "is it taken?")
    await server.start()
    if fronts is not None:
        await fronts.start()
        port = settings.grpc_port
    return fronts, port


def _freeze_heap() -> None:
    """Move the start-up heap out of the garbage collector's way for the process's life."""
    # The heap holds torch and the model's objects for the process's life: out of the
    # collector's way, so a full collection (triggered by the front's per-message garbage)
    # no longer walks it (7% of the front's time at 128 streams, bench/front_bench.py).
    gc.collect()
    gc.freeze()


async def _serve_http(settings: TTSSettings, metrics: TTSMetrics, running: RunningServer,
                      keys: ApiKeys, library: VoiceLibrary) -> web.AppRunner:
    """Start the HTTP side: metrics, health, OpenAI-style speech, the speech WebSocket."""
    cors_origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    return await start_http(settings.grpc_host, settings.http_port, metrics.registry,
                            lambda: running.serving, running.calls, keys, library=library,
                            cors_origins=cors_origins,
                            header_timeout_s=settings.header_timeout_s)


def _watch_faults(running: RunningServer, engine: Engine | EngineSet, stall_s: float
                  ) -> None:
    """Fail the server on an engine fault (from its thread) or stall (the watchdog)."""
    loop = asyncio.get_running_loop()

    def on_fatal(exc: BaseException) -> None:  # engine thread
        msg = (f"TTS engine fault ({type(exc).__name__}: {str(exc)[:200]}); the server "
               "is restarting, retry on another replica")
        loop.call_soon_threadsafe(lambda: loop.create_task(running.fail(msg)))

    engine.on_fatal = on_fatal
    if engine.fatal is not None:  # it failed before the hook was set
        on_fatal(engine.fatal)
    running.watchdog = loop.create_task(_watch_engine(running, stall_s))


async def _watch_engine(running: RunningServer, stall_s: float) -> None:
    """A stuck engine (a device sync that never returns) raises nothing: fail it by time."""
    engine = running.calls.engine
    while not running.failed.is_set():
        await asyncio.sleep(min(1.0, stall_s / 4))
        stalled = engine.stalled_for()
        if stalled > stall_s:
            await running.fail(f"TTS engine stalled for {stalled:.0f} s (TTS_ENGINE_STALL_S="
                               f"{stall_s:g}); the server is restarting, retry on another "
                               "replica")


async def serve(settings: TTSSettings) -> None:
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopped, failed = (asyncio.create_task(e.wait()) for e in (stop, running.failed))
    await asyncio.wait((stopped, failed), return_when=asyncio.FIRST_COMPLETED)
    if running.failed.is_set():
        await running.exit_after_fault()
    log.info("signal received: draining (up to %.0f s)", settings.drain_timeout_s)
    await running.drain(settings.drain_timeout_s)
