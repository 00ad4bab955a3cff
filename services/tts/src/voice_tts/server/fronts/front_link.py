"""gRPC front processes (`TTS_FRONT_PROCS=N`): the protocol's per-message work off the
engine's process.

At 1 frame a message grpc.aio's own work is ~42 us a message on the H100 host, more than
the whole front costs a frame at 4 frames a message (bench/results/2026-11-27-front-cost):
one process cannot serve the contract's default at the engine's bound. So N processes
(`grpc_front.py`) serve `voice.tts.v1.TextToSpeech` and health on TTS_GRPC_PORT
(SO_REUSEPORT: the kernel spreads connections over them) and hand each call over one Unix
socket a process (`Link`) to this process, which runs it exactly as its own gRPC server
would (the servicer's handlers, admission, pacing, drain, metrics: all here, one of
each). Responses cross pre-serialized, batched per event-loop turn; the front writes
them to its client and acknowledges them (`ACK`), so a client that does not read holds
at most `WINDOW` messages in flight and then stalls its own call, as gRPC's flow control
would. The engine's process keeps a gRPC server of its own on a private port (its health
and its handlers, as without fronts). A front that dies fails this process (the
orchestrator restarts the pod); this process gone, every front exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from voice_tts.settings import TTSSettings

log = logging.getLogger("voice_tts.fronts")

# Frame: payload length, kind, call id; then the payload.
HEADER = struct.Struct("<IBI")
OPEN, MSG, HALF, CANCEL, END, STATE, ACK, READY = range(1, 9)
WINDOW = 256  # responses a call may have unacknowledged (the front acks every ACK_EVERY)
ACK_EVERY = 32
READY_TIMEOUT_S = 60.0


class Link:
    """One front's socket: frames out batched per loop turn, frames in one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._out: list[bytes] = []

    def send(self, kind: int, call: int = 0, payload: bytes = b"") -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(HEADER.pack(len(payload), kind, call) + payload)

    def _flush(self) -> None:
        if self._out and not self.writer.is_closing():
            self.writer.write(b"".join(self._out))
        self._out.clear()

    async def recv(self) -> tuple[int, int, bytes]:
        n, kind, call = HEADER.unpack(await self.reader.readexactly(HEADER.size))
        return kind, call, (await self.reader.readexactly(n) if n else b"")


def end_payload(code: grpc.StatusCode, details: str = "") -> bytes:
    return struct.pack("<I", code.value[0]) + details.encode()


def parse_end(payload: bytes) -> tuple[grpc.StatusCode, str]:
    (number,) = struct.unpack("<I", payload[:4])
    code = next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)
    return code, payload[4:].decode(errors="replace")


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details


class _Context:
    """What the servicer's handlers use of a `ServicerContext`: `abort`."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method, self.invocation_metadata = method, ()


_END = object()


class _Call:
    """A call a front handed over, run by the servicer's handler here."""

    def __init__(self, link: Link, cid: int, handler: grpc.RpcMethodHandler) -> None:
        self.link, self.cid, self.handler = link, cid, handler
        self.requests: asyncio.Queue[Any] = asyncio.Queue()
        self.unacked = 0
        self._credit = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    def ack(self, n: int) -> None:
        self.unacked -= n
        if self.unacked < WINDOW:
            self._credit.set()

    async def _requests(self) -> AsyncIterator[Any]:
        parse = self.handler.request_deserializer
        while (raw := await self.requests.get()) is not _END:
            yield parse(raw) if parse is not None else raw

    def _send(self, response: Any) -> None:
        ser = self.handler.response_serializer
        self.link.send(MSG, self.cid, ser(response) if ser is not None else response)
        self.unacked += 1

    async def _window(self) -> None:
        while self.unacked >= WINDOW:  # the client reads no faster: wait for its acks
            self._credit.clear()
            await self._credit.wait()

    async def _run(self) -> None:
        h, ctx = self.handler, _Context()
        try:
            if h.response_streaming:
                requests: Any = self._requests()
                if not h.request_streaming:
                    requests = await anext(requests)
                    stream = h.unary_stream(requests, ctx)
                else:
                    stream = h.stream_stream(requests, ctx)
                async for response in stream:  # per frame: no await unless it must
                    self._send(response)
                    if self.unacked >= WINDOW:
                        await self._window()
            else:
                requests = self._requests()
                if h.request_streaming:
                    response = await h.stream_unary(requests, ctx)
                else:
                    response = await h.unary_unary(await anext(requests), ctx)
                self._send(response)
            self.link.send(END, self.cid, end_payload(grpc.StatusCode.OK))
        except _Abort as a:
            self.link.send(END, self.cid, end_payload(a.code, a.details))
        except asyncio.CancelledError:
            raise  # the front cancelled it: nobody to answer
        except Exception:
            log.exception("front call %d failed", self.cid)
            self.link.send(END, self.cid, end_payload(grpc.StatusCode.INTERNAL,
                                                      "internal error"))


class FrontProcs:
    """Starts and serves the gRPC front processes (module docstring)."""

    def __init__(self, settings: TTSSettings, handler: grpc.GenericRpcHandler,
                 on_lost: Callable[[str], None]) -> None:
        self.n, self.host, self.port = settings.front_procs, settings.grpc_host, settings.grpc_port
        self.handler, self.on_lost = handler, on_lost
        # what a front reads of the settings: this process's, whatever its environment said
        self.env = {**os.environ, "TTS_GRPC_HOST": self.host, "TTS_GRPC_PORT": str(self.port),
                    "TTS_API_KEYS": settings.api_keys.get_secret_value(),
                    "TTS_VOICE_MAX_UPLOAD_BYTES": str(settings.voice_max_upload_bytes),
                    "TTS_LOG_LEVEL": settings.log_level}
        self.env.pop("TTS_API_KEYS_FILE", None)
        if settings.api_keys_file is not None:
            self.env["TTS_API_KEYS_FILE"] = str(settings.api_keys_file)
        self.links: list[Link] = []
        self.procs: list[subprocess.Popen] = []
        self._ready = 0
        self._all_ready = asyncio.Event()
        self._stopping = False
        self._lost = False  # a front gone before all were ready: start() fails
        self._dir = ""
        self._server: asyncio.AbstractServer | None = None
        self._state = b"NOT_SERVING"

    async def start(self) -> None:
        # SO_REUSEPORT lets the fronts share the port, and would let a second server's
        # too: refuse a taken port here first.
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as s:
            try:
                s.bind((self.host, self.port))
            except OSError:
                raise RuntimeError(f"cannot bind gRPC port {self.port} (TTS_GRPC_PORT): is "
                                   "it taken?") from None
        self._dir = tempfile.mkdtemp(prefix="tts-fronts-")
        path = os.path.join(self._dir, "link.sock")
        self._server = await asyncio.start_unix_server(self._serve, path)
        for i in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "voice_tts.server.fronts.grpc_front", path, str(i)],
                env=self.env))
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_S
        while not self._all_ready.is_set():
            gone = [p.pid for p in self.procs if p.poll() is not None]
            late = asyncio.get_running_loop().time() > deadline
            if gone or late or self._lost:
                await self.stop()
                raise RuntimeError(f"{self.n - self._ready} of {self.n} gRPC front processes "
                                   f"did not start{' (exited)' if gone else ''} "
                                   "(TTS_FRONT_PROCS; their errors are in this log)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_ready.wait(), 0.2)
        log.info("%d gRPC front process(es) serving :%d", self.n, self.port)

    def set_serving(self, serving: bool) -> None:
        self._state = b"SERVING" if serving else b"NOT_SERVING"
        for link in self.links:
            link.send(STATE, 0, self._state)

    async def stop(self) -> None:
        self._stopping = True
        for link in self.links:
            link.writer.close()
        if self._server is not None:
            self._server.close()
        for p in self.procs:
            try:
                await asyncio.to_thread(p.wait, 5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(reader, writer)
        self.links.append(link)
        link.send(STATE, 0, self._state)
        calls: dict[int, _Call] = {}
        try:
            while True:
                kind, cid, payload = await link.recv()
                if kind == MSG:
                    if (c := calls.get(cid)) is not None:
                        c.requests.put_nowait(payload)
                elif kind == ACK:
                    if (c := calls.get(cid)) is not None:
                        c.ack(struct.unpack("<I", payload)[0])
                elif kind == OPEN:
                    h = self.handler.service(_Details(payload.decode()))
                    if h is None:
                        link.send(END, cid, end_payload(grpc.StatusCode.UNIMPLEMENTED,
                                                        "unknown method"))
                        continue
                    c = calls[cid] = _Call(link, cid, h)
                    c.task.add_done_callback(lambda _t, cid=cid: calls.pop(cid, None))
                elif kind == HALF:
                    if (c := calls.get(cid)) is not None:
                        c.requests.put_nowait(_END)
                elif kind == CANCEL:
                    if (c := calls.pop(cid, None)) is not None:
                        c.task.cancel()
                elif kind == READY:
                    self._ready += 1
                    if self._ready == self.n:
                        self._all_ready.set()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the front closed its end, or this process is shutting down
        finally:
            for c in list(calls.values()):
                c.task.cancel()
            with contextlib.suppress(ValueError):
                self.links.remove(link)
            if not self._all_ready.is_set():
                self._lost = True
            elif not self._stopping:
                self.on_lost("a gRPC front process is gone (TTS_FRONT_PROCS); the server "
                             "is restarting")
