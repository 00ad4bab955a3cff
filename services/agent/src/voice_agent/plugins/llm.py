"""livekit-agents LLM plugin for the thinker (voice.llm.v1.Thinker/Chat, server streaming).

The chat context becomes a ChatRequest: system/developer messages are joined into
`system_prompt`, user/assistant text (and user audio frames, if any) become Messages;
tool calls are not part of the v1 contract and are skipped. Function tools (an Agent's
@function_tool) are refused: the thinker cannot call them, so a chat with tools fails at
once with a non-retryable APIError naming them (the session's `error` event, logged once
per plugin), rather than answering as if they were not there. The context is bounded:
only the last `max_messages` user/assistant messages go out (the agent trims the stored
history at twice that), and a window that had to be cut starts with a user turn (a
whole conversation may start with the assistant's greeting).

Each delta is forwarded as a ChatChunk the moment it arrives; the final message's
token counts become the chunk's usage. Cancelling the stream (the framework does on
interruption; `LLM.cancel_all()` is the duplex controller's direct path) cancels the
gRPC call, which aborts the generation in the thinker.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import grpc
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    APIError,
    NotGivenOr,
    llm,
    utils,
)
from livekit.agents.llm import ChatContext, Tool
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc

from ..metrics import TurnTracker
from ._grpc import ChannelCache, to_api_error
from .utterances import UtteranceStore

log = logging.getLogger("voice_agent.llm")

_REPLY_DEADLINE_S = 120.0
_ROLES = {"user": thinker_pb2.ROLE_USER, "assistant": thinker_pb2.ROLE_ASSISTANT}


@dataclass
class _LLMOptions:
    addr: str
    max_tokens: int
    temperature: float
    max_messages: int
    seed: int | None


def frames_to_pcm16k(frames: list[rtc.AudioFrame]) -> bytes:
    """Mono s16le at 16 kHz (the thinker's only audio format), resampling if needed."""
    if not frames:
        return b""
    merged = rtc.combine_audio_frames(frames)
    if merged.num_channels != 1:
        raise ValueError("audio for the thinker must be mono")
    if merged.sample_rate == 16000:
        return bytes(merged.data)
    rs = rtc.AudioResampler(input_rate=merged.sample_rate, output_rate=16000, num_channels=1)
    out = [*rs.push(merged), *rs.flush()]
    return b"".join(bytes(f.data) for f in out)


def tools_refusal(tools: list[Tool]) -> str:
    names = ", ".join(sorted(t.id for t in tools))
    return (f"function tools are not supported by the voice.llm.v1 thinker: {names} "
            "(remove them from the Agent, or use an LLM plugin that calls tools)")


def _audio_part(pcm: bytes) -> thinker_pb2.Part:
    return thinker_pb2.Part(audio=thinker_pb2.AudioPart(
        data=pcm, format=thinker_pb2.AUDIO_FORMAT_PCM_S16LE, sample_rate=16000))


def build_messages(
    chat_ctx: ChatContext, max_messages: int, utterances: UtteranceStore | None = None
) -> tuple[str, list[thinker_pb2.Message]]:
    """(system prompt, bounded message window) for a ChatRequest; user text that is an
    utterance marker (STT "audio" mode) becomes that utterance's audio."""
    system: list[str] = []
    msgs: list[thinker_pb2.Message] = []
    for item in chat_ctx.items:
        if item.type != "message":
            continue  # tool calls / handoffs are not in the v1 contract
        if item.role in ("system", "developer"):
            if item.text_content:
                system.append(item.text_content)
            continue
        role = _ROLES.get(item.role)
        if role is None:
            continue
        parts: list[thinker_pb2.Part] = []
        for c in item.content:
            if isinstance(c, str):
                stored = (utterances.get(c) if utterances is not None
                          and role == thinker_pb2.ROLE_USER else None)
                if stored:
                    parts.append(_audio_part(stored))
                elif c:
                    parts.append(thinker_pb2.Part(text=c))
            elif getattr(c, "type", None) == "audio_content" and role == thinker_pb2.ROLE_USER:
                pcm = frames_to_pcm16k(list(c.frame))
                if pcm:
                    parts.append(_audio_part(pcm))
        if parts:
            msgs.append(thinker_pb2.Message(role=role, parts=parts))
    if len(msgs) > max_messages:
        msgs = msgs[-max_messages:]
        while msgs and msgs[0].role == thinker_pb2.ROLE_ASSISTANT and len(msgs) > 1:
            msgs.pop(0)  # a cut window starts with the user, not half an exchange
    return "\n".join(system), msgs


class LLM(llm.LLM):
    def __init__(
        self,
        *,
        addr: str = "localhost:50052",
        max_tokens: int = 150,
        temperature: float = 0.3,
        max_messages: int = 16,
        seed: int | None = None,
        utterances: UtteranceStore | None = None,
        tracker: TurnTracker | None = None,
        api_key: str = "",
    ) -> None:
        super().__init__()
        self._utterances = utterances
        self._opts = _LLMOptions(addr=addr, max_tokens=max_tokens, temperature=temperature,
                                 max_messages=max_messages, seed=seed)
        self._channels = ChannelCache(addr, api_key)  # the thinker's key (LLM_API_KEYS)
        self._tracker = tracker
        self._streams: weakref.WeakSet[LLMStream] = weakref.WeakSet()
        self.last_request: thinker_pb2.ChatRequest | None = None  # for logs and tests
        self._refused_tools = False

    @property
    def model(self) -> str:
        return "voice.llm.v1"

    @property
    def provider(self) -> str:
        return self._opts.addr

    def chat(
        self,
        *,
        chat_ctx: ChatContext,
        tools: list[Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[object] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, object]] = NOT_GIVEN,
    ) -> LLMStream:
        if tools and not self._refused_tools:
            self._refused_tools = True  # every chat refuses them; the log says it once
            log.error("%s", tools_refusal(tools))
        s = LLMStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)
        self._streams.add(s)
        return s

    def cancel_all(self) -> int:
        """Barge-in: cancel every running thinker call now; returns how many."""
        n = 0
        for s in list(self._streams):
            if s.cancel():
                n += 1
        return n

    async def aclose(self) -> None:
        await self._channels.aclose()


class LLMStream(llm.LLMStream):
    def __init__(self, llm_: LLM, *, chat_ctx: ChatContext, tools: list[Tool],
                 conn_options: APIConnectOptions) -> None:
        super().__init__(llm_, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)
        self._llm_: LLM = llm_
        self._call: grpc.aio.UnaryStreamCall | None = None
        self.cancelled_by_barge_in = False
        self.text = ""
        self.request_id = ""

    def cancel(self) -> bool:
        """Cancel the gRPC call (the thinker aborts the generation). True if it was live."""
        call = self._call
        if call is None or call.done():
            return False
        self.cancelled_by_barge_in = True
        return bool(call.cancel())

    async def _run(self) -> None:
        if self._tools:
            raise APIError(tools_refusal(self._tools), retryable=False)
        opts = self._llm_._opts
        tracker = self._llm_._tracker
        request_id = self.request_id = tracker.llm_started() if tracker else utils.shortuuid()
        system, msgs = build_messages(self._chat_ctx, opts.max_messages,
                                      self._llm_._utterances)
        req = thinker_pb2.ChatRequest(messages=msgs, max_tokens=opts.max_tokens,
                                      temperature=opts.temperature, system_prompt=system,
                                      request_id=request_id)
        if opts.seed is not None:
            req.seed = opts.seed
        self._llm_.last_request = req
        stub = thinker_pb2_grpc.ThinkerStub(self._llm_._channels.get())
        # A whole reply's deadline, not the connect timeout: replies stream for seconds.
        call = stub.Chat(req, timeout=_REPLY_DEADLINE_S,
                         metadata=self._llm_._channels.metadata)
        self._call = call
        try:
            async for delta in call:
                if delta.text:
                    if tracker is not None and not self.text:
                        tracker.llm_first_token()
                    self.text += delta.text
                    self._event_ch.send_nowait(llm.ChatChunk(
                        id=request_id,
                        delta=llm.ChoiceDelta(role="assistant", content=delta.text)))
                if delta.HasField("final"):
                    f = delta.final
                    self._event_ch.send_nowait(llm.ChatChunk(
                        id=request_id,
                        usage=llm.CompletionUsage(
                            completion_tokens=f.completion_tokens,
                            prompt_tokens=f.prompt_tokens,
                            total_tokens=f.prompt_tokens + f.completion_tokens)))
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self.cancelled_by_barge_in:
                log.info("thinker call cancelled by barge-in request_id=%s", request_id)
                return
            if tracker is not None:
                tracker.error("llm", f"{e.code().name}: {e.details()}")
            raise to_api_error(e, "thinker Chat") from None
        finally:
            call.cancel()
