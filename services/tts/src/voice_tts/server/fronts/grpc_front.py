"""One gRPC front process (`TTS_FRONT_PROCS`; front_link.py says why and how): serves
`voice.tts.v1.TextToSpeech`, health and reflection on TTS_GRPC_PORT with SO_REUSEPORT,
checks API keys as the engine's process does, and hands every call over its link.

Started by the server (`python -m voice_tts.server.fronts.grpc_front LINK INDEX`), never by
hand. No torch here: a front costs a Python interpreter and grpcio.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from voice.tts.v1 import tts_pb2
from voice_keys import ApiKeys
from voice_keys.grpc_check import GrpcKeyCheck

from voice_tts.server.call.refusal import until_client_stops_writing
from voice_tts.server.fronts.front_link import (
    ACK,
    ACK_EVERY,
    CANCEL,
    END,
    HALF,
    MSG,
    OPEN,
    READY,
    STATE,
    Link,
    parse_end,
)
from voice_tts.settings import KEY_HOW, TTSSettings

SERVICE = "voice.tts.v1.TextToSpeech"
UNARY = ("ListVoices", "CreateVoice", "GetVoice", "DeleteVoice")
log = logging.getLogger("voice_tts.front")


class Front:
    def __init__(self, link: Link) -> None:
        self.link = link
        self.calls: dict[int, asyncio.Queue[tuple[int, bytes]]] = {}
        self.ids = itertools.count(1)

    def _open(self, method: str) -> tuple[int, asyncio.Queue[tuple[int, bytes]]]:
        cid = next(self.ids)
        q: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.calls[cid] = q
        self.link.send(OPEN, cid, f"/{SERVICE}/{method}".encode())
        return cid, q

    async def synthesize(self, requests: AsyncIterator[bytes],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        cid, q = self._open("Synthesize")

        async def forward() -> None:
            async for raw in requests:
                self.link.send(MSG, cid, raw)
            self.link.send(HALF, cid)

        pump = asyncio.ensure_future(forward())
        ended, written = False, 0
        try:
            while True:
                kind, payload = await q.get()
                if kind == MSG:
                    yield payload
                    written += 1
                    if written % ACK_EVERY == 0:
                        self.link.send(ACK, cid, struct.pack("<I", ACK_EVERY))
                    continue
                ended = True
                code, details = parse_end(payload)
                if code != grpc.StatusCode.OK:
                    await context.abort(code, details)
                return
        finally:
            pump.cancel()
            self.calls.pop(cid, None)
            if not ended:
                self.link.send(CANCEL, cid)

    def unary(self, method: str):  # type: ignore[no-untyped-def]
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            cid, q = self._open(method)
            self.link.send(MSG, cid, request)
            self.link.send(HALF, cid)
            response, ended = b"", False
            try:
                while True:
                    kind, payload = await q.get()
                    if kind == MSG:
                        response = payload
                        continue
                    ended = True
                    code, details = parse_end(payload)
                    if code != grpc.StatusCode.OK:
                        await context.abort(code, details)
                    return response
            finally:
                self.calls.pop(cid, None)
                if not ended:
                    self.link.send(CANCEL, cid)
        return call

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Synthesize": grpc.stream_stream_rpc_method_handler(self.synthesize),
            **{m: grpc.unary_unary_rpc_method_handler(self.unary(m)) for m in UNARY}})

    async def read_link(self, health_servicer: health.aio.HealthServicer) -> None:
        """Frames from the engine's process, until it closes the link."""
        while True:
            kind, cid, payload = await self.link.recv()
            if kind in (MSG, END):
                if (q := self.calls.get(cid)) is not None:
                    q.put_nowait((kind, payload))
            elif kind == STATE:
                status = (health_pb2.HealthCheckResponse.SERVING if payload == b"SERVING"
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
                for name in ("", SERVICE):
                    await health_servicer.set(name, status)


def grpc_server(settings: TTSSettings, reuseport: bool) -> tuple[grpc.aio.Server, ApiKeys]:
    """The TTS's gRPC server, keys checked (the engine's process and every front alike)."""
    keys = ApiKeys(settings.api_keys.get_secret_value(), settings.api_keys_file,
                   file_setting="TTS_API_KEYS_FILE", how=KEY_HOW)
    # Streaming calls are answered once their writes end, as admission does (see there).
    check = GrpcKeyCheck(keys, drain=until_client_stops_writing)
    # A CreateVoice message holds the reference audio: up to the upload limit (the
    # server refuses larger audio with its own message, not grpc's generic one).
    max_message = max(4 << 20, settings.voice_max_upload_bytes + (1 << 20))
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuseport)),
                                      ("grpc.max_receive_message_length", max_message)],
                             interceptors=[check] if keys.enabled else [])
    return server, keys


async def main(path: str, index: int) -> None:
    settings = TTSSettings()
    reader, writer = await asyncio.open_unix_connection(path)
    front = Front(Link(reader, writer))
    server, _ = grpc_server(settings, reuseport=True)
    server.add_generic_rpc_handlers([front.handler()])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    _ = tts_pb2.DESCRIPTOR  # registers the file descriptor that reflection serves
    reflection.enable_server_reflection(
        [SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    if server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}") == 0:
        log.critical("front %d: cannot bind gRPC port %d", index, settings.grpc_port)
        os._exit(1)
    await server.start()
    front.link.send(READY)
    # until the engine's process closes the link (the drain's end) or is gone
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        await front.read_link(health_servicer)
    await server.stop(grace=0.5)


def run() -> None:
    logging.basicConfig(level=os.environ.get("TTS_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The engine's process owns the shutdown: it drains, then closes the links, and a
    # front exits with its link. A signal to the whole process group (Ctrl-C in a
    # terminal, `timeout`, systemd's control-group kill) must not end the fronts first:
    # the engine's process then took a front gone for a crash and cut every call
    # UNAVAILABLE instead of draining (seen on the H100, bench/results/2026-11-28-gpu-bound).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(main(sys.argv[1], int(sys.argv[2])))


if __name__ == "__main__":
    run()
