"""Assembles and runs the TTS service: engine, gRPC (TTS + health + reflection), HTTP.

Start-up order matters to orchestrators: health says SERVING only after the engine has
loaded and warmed up. SIGTERM drains: health goes NOT_SERVING, new calls get
UNAVAILABLE, in-flight utterances get `drain_timeout_s` to finish, then the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from voice.tts.v1 import tts_pb2

from voice_tts.engine import Engine, EngineSettings
from voice_tts.server.http import start_http
from voice_tts.server.metrics import TTSMetrics
from voice_tts.server.servicer import SERVICE_NAME, TextToSpeechServicer
from voice_tts.settings import TTSSettings

log = logging.getLogger("voice_tts.server")


def load_engine(settings: TTSSettings) -> Engine:
    """The engine the settings name: a checkpoint directory or a random-weight preset."""
    es = EngineSettings(max_sessions=settings.max_sessions, max_batch=settings.max_sessions,
                        first_packet_frames=settings.first_packet_frames,
                        packet_frames=settings.packet_frames,
                        decoder_precision=(settings.decoder_precision
                                           if settings.device.startswith("cuda") else "fp32"))
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
    servicer: TextToSpeechServicer
    health: health.aio.HealthServicer
    grpc_port: int
    http_runner: object | None
    serving: bool = False

    async def drain(self, timeout: float) -> None:
        """Stop accepting, let in-flight calls finish (bounded), then stop."""
        self.servicer.draining = True
        self.serving = False
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        deadline = time.monotonic() + timeout
        while self.servicer.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        log.info("drained; %d call(s) still open are cancelled", len(self.servicer.active))
        await self.server.stop(grace=0.5)
        if self.http_runner is not None:
            await self.http_runner.cleanup()  # type: ignore[attr-defined]
        self.servicer.engine.shutdown()


async def start_server(settings: TTSSettings, engine: Engine | None = None) -> RunningServer:
    engine = engine or load_engine(settings)
    metrics = TTSMetrics()

    gpu_sampled = [0.0]  # last tts_gpu_memory_bytes update (monotonic s)

    def sample_gpu_memory() -> None:
        if engine.device.type == "cuda":
            gpu_sampled[0] = time.monotonic()
            metrics.gpu_memory.labels("allocated").set(torch.cuda.memory_allocated(engine.device))
            metrics.gpu_memory.labels("reserved").set(torch.cuda.memory_reserved(engine.device))

    def on_step(stats: object) -> None:  # called from the engine thread
        metrics.step_seconds.observe(stats.step_ms / 1e3)  # type: ignore[attr-defined]
        metrics.batch_size.observe(stats.batch_size)  # type: ignore[attr-defined]
        servicer.admission.model.observe(stats)  # admission's capacity model learns
        if time.monotonic() - gpu_sampled[0] >= 0.5:
            sample_gpu_memory()

    servicer = TextToSpeechServicer(engine, settings, metrics)  # before the first step
    engine.on_step = on_step
    sample_gpu_memory()
    engine.start()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([servicer.handler()])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    _ = tts_pb2.DESCRIPTOR  # registers the file descriptor that reflection serves
    port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC port {settings.grpc_port} (TTS_GRPC_PORT): "
                           "is it taken?")
    await server.start()
    running = RunningServer(server, servicer, health_servicer, port, None)
    if settings.http_port:
        running.http_runner = await start_http(settings.grpc_host, settings.http_port,
                                               metrics.registry, lambda: running.serving)
    running.serving = True
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("TTS serving on :%d (gRPC), :%d (HTTP) model=%s device=%s max_sessions=%d",
             port, settings.http_port, engine.model_name, settings.device,
             settings.max_sessions)
    return running


async def serve(settings: TTSSettings) -> None:
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: draining (up to %.0f s)", settings.drain_timeout_s)
    await running.drain(settings.drain_timeout_s)
