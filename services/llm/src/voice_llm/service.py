"""The Thinker servicer: thin glue from gRPC calls to a Backend.

Per call: admit (or RESOURCE_EXHAUSTED / UNAVAILABLE), validate (protocol.to_job), turn
audio into text if the model cannot hear and an ASR step is configured, then relay the
backend's chunks as ChatDeltas and close with a ChatFinal. Every error leaves through
errors.status_for, the one place that picks status codes.

Cancellation: when the client cancels, gRPC cancels this handler's task; the `finally`
in `_relay` then aborts the request in the backend (shielded, so the abort itself cannot
be cancelled half-way) and counts it in llm_aborts_total. Backends also abort when their
stream is closed, so a request never keeps generating for a caller that has gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
from voice.llm.v1 import thinker_pb2 as pb
from voice.llm.v1 import thinker_pb2_grpc as pb_grpc

from voice_llm.asr import Transcriber
from voice_llm.backends.base import Backend
from voice_llm.chat import AudioClip, ChatJob, ChatMessage
from voice_llm.errors import AudioNotSupported, Draining, NotReady, Overloaded, status_for
from voice_llm.metrics import ThinkerMetrics
from voice_llm.protocol import (
    MAX_REQUEST_ID_CHARS,
    final_delta,
    parse_chat_request,
    request_id_of,
    to_job,
    tool_call_delta,
)
from voice_llm.settings import Settings

log = logging.getLogger(__name__)


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Thinker"].full_name


class ThinkerService(pb_grpc.ThinkerServicer):
    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        metrics: ThinkerMetrics,
        transcriber: Transcriber | None = None,
    ) -> None:
        self._backend = backend
        self._settings = settings
        self._metrics = metrics
        self._transcriber = transcriber
        self._active = 0
        self._draining = False
        self.ready = False  # set by the server once the backend has loaded and warmed up
        self.failed: str | None = None  # the backend cannot go on: every call is refused
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        self._draining = True

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def handler(self) -> grpc.GenericRpcHandler:
        """`Chat` on raw bytes: parsed in `Chat`, so a bad message is the client's error."""
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Chat": grpc.unary_stream_rpc_method_handler(
                self.Chat, request_deserializer=None,
                response_serializer=pb.ChatDelta.SerializeToString)})

    async def Chat(
        self, request: pb.ChatRequest | bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ChatDelta]:
        received = time.perf_counter()
        rid = "-"
        try:
            if isinstance(request, bytes):
                request = parse_chat_request(request)
            # bounded: an over-long id is refused below, and never logged whole
            rid = request.request_id[:MAX_REQUEST_ID_CHARS] or "-"
            rid = request_id_of(request)
            self._admit()
            try:
                job = to_job(request, rid, self._settings)
                job = await self._hear(job)
                async for delta in self._relay(job, received):
                    yield delta
            finally:
                self._release()
        except Exception as e:
            code, message = status_for(e)
            self._metrics.errors.labels(code.name).inc()
            self._metrics.requests.labels("error").inc()
            level = logging.ERROR if code is grpc.StatusCode.INTERNAL else logging.INFO
            log.log(
                level,
                "chat failed",
                extra={"request_id": rid, "code": code.name, "reason": str(e)},
                exc_info=code is grpc.StatusCode.INTERNAL,
            )
            await context.abort(code, message)

    def _admit(self) -> None:
        if self._draining:
            raise Draining("the thinker is shutting down; retry on another instance")
        if self.failed is not None:
            raise Draining(self.failed)
        if not self.ready:
            raise NotReady("the thinker is still loading its model (health NOT_SERVING); "
                           "retry shortly")
        if self._active >= self._settings.max_concurrent:
            raise Overloaded(
                f"the thinker is at its limit of {self._settings.max_concurrent} concurrent "
                "requests (LLM_MAX_CONCURRENT); retry later"
            )
        self._active += 1
        self._idle.clear()
        self._metrics.active.set(self._active)

    def _release(self) -> None:
        self._active -= 1
        self._metrics.active.set(self._active)
        if self._active == 0:
            self._idle.set()

    async def _hear(self, job: ChatJob) -> ChatJob:
        """Audio stays audio for a model that hears; else it is transcribed, or rejected."""
        if not job.has_audio or self._backend.accepts_audio:
            return job
        if self._transcriber is None:
            raise AudioNotSupported(
                f"this thinker's model takes text only ({self._backend.name} backend) and no "
                "ASR step is configured (LLM_ASR_MODEL): send text parts, or use an "
                "audio-capable model (Qwen3-Omni on the vllm backend)"
            )
        messages = []
        for m in job.messages:
            parts = [
                await self._transcriber.transcribe(p) if isinstance(p, AudioClip) else p
                for p in m.parts
            ]
            messages.append(ChatMessage(m.role, tuple(parts), m.tool_calls, m.tool_call_id))
        return ChatJob(job.request_id, tuple(messages), job.options, job.tools, job.tool_choice)

    async def _relay(self, job: ChatJob, received: float) -> AsyncIterator[pb.ChatDelta]:
        rid = job.request_id
        stream = self._backend.generate(job)
        first_out: float | None = None
        completion = 0
        calls = 0  # the next tool call's index
        done = False
        try:
            async for chunk in stream:
                completion += chunk.new_tokens
                self._metrics.tokens.inc(chunk.new_tokens)
                now = time.perf_counter()
                if (chunk.text or chunk.tool_calls) and first_out is None:
                    first_out = now
                    self._metrics.ttft.observe(now - received)
                if chunk.tool_calls:  # text and calls never share a delta: text first
                    if chunk.text:
                        yield pb.ChatDelta(request_id=rid, text=chunk.text)
                        chunk.text = ""
                    for call in chunk.tool_calls:
                        yield tool_call_delta(rid, calls, call)
                        calls += 1
                if chunk.finish is not None:
                    done = True
                    first = first_out if first_out is not None else now
                    if completion > 1 and now > first:
                        self._metrics.tokens_per_second.observe((completion - 1) / (now - first))
                    self._metrics.requests.labels(chunk.finish.value).inc()
                    log.info(
                        "chat done",
                        extra={
                            "request_id": rid,
                            "finish": chunk.finish.value,
                            "prompt_tokens": chunk.prompt_tokens,
                            "completion_tokens": completion,
                            "ttft_ms": round((first - received) * 1e3, 2),
                            "total_ms": round((now - received) * 1e3, 2),
                        },
                    )
                    yield final_delta(
                        rid,
                        chunk.finish,
                        chunk.prompt_tokens,
                        completion,
                        ttft_ms=(first - received) * 1e3,
                        total_ms=(now - received) * 1e3,
                        text=chunk.text,
                    )
                    return
                if chunk.text:
                    yield pb.ChatDelta(request_id=rid, text=chunk.text)
        except ValueError:
            done = True  # rejected input (prompt too long...): nothing ran, nothing to abort
            raise
        finally:
            if not done:
                await asyncio.shield(self._abort(rid, completion))
            await stream.aclose()  # type: ignore[attr-defined]

    async def _abort(self, rid: str, completion: int) -> None:
        self._metrics.aborts.inc()
        self._metrics.requests.labels("aborted").inc()
        log.info("chat aborted", extra={"request_id": rid, "completion_tokens": completion})
        await self._backend.abort(rid)
