"""livekit-agents LLM plugin for the thinker (voice.llm.v1.Thinker/Chat, server streaming).

The chat context becomes a ChatRequest: system/developer messages are joined into
`system_prompt`, user/assistant text (and user audio frames, if any) become Messages, a
`function_call` item becomes a ToolCall of an assistant Message and its
`function_call_output` a ROLE_TOOL Message. Function tools (an Agent's @function_tool,
FunctionTool or RawFunctionTool) go out as `tools` with their JSON Schema, `tool_choice`
as the thinker's ToolChoice (REQUIRED / a named function: the thinker constrains the
reply to one schema-valid call). The context is bounded: only the last `max_messages`
messages go out (the agent trims the stored history at twice that), and a window that
had to be cut starts with a user turn (a whole conversation may start with the
assistant's greeting), never with a tool result whose call was cut.

Each text delta is forwarded as a ChatChunk the moment it arrives; tool calls are
collected by index and sent at the end of the reply, one whole `FunctionToolCall` a
chunk (what livekit-agents executes); the final message's token counts become the
chunk's usage. Cancelling the stream (the framework does on
interruption; `LLM.cancel_all()` is the duplex controller's direct path) cancels the
gRPC call, which aborts the generation in the thinker.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import weakref
from dataclasses import dataclass
from typing import Any

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
from livekit.agents.llm import ChatContext, Tool, ToolChoice, ToolContext
from livekit.agents.llm.tool_context import is_function_tool, is_raw_function_tool
from livekit.agents.llm.utils import build_legacy_openai_schema
from livekit.agents.utils import is_given
from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc

from ..metrics import TurnTracker
from ._grpc import ChannelCache, to_api_error
from .utterances import UtteranceStore

log = logging.getLogger("voice_agent.llm")

_REPLY_DEADLINE_S = 120.0
_ROLES = {"user": thinker_pb2.ROLE_USER, "assistant": thinker_pb2.ROLE_ASSISTANT}
_TOOL_MODES = {"auto": thinker_pb2.TOOL_CHOICE_MODE_AUTO,
               "none": thinker_pb2.TOOL_CHOICE_MODE_NONE,
               "required": thinker_pb2.TOOL_CHOICE_MODE_REQUIRED}


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


def build_tools(tools: list[Tool]) -> list[thinker_pb2.Tool]:
    """livekit function tools -> the thinker's Tools (name, description, JSON Schema);
    provider tools (run by a cloud provider, not by the agent) are not sent."""
    out = []
    for tool in ToolContext(tools).function_tools.values():
        if is_raw_function_tool(tool):
            raw = tool.info.raw_schema
            name, description = raw["name"], raw.get("description", "")
            parameters = raw.get("parameters") or {"type": "object", "properties": {}}
        elif is_function_tool(tool):
            fn = build_legacy_openai_schema(tool)["function"]
            name, description, parameters = fn["name"], fn["description"], fn["parameters"]
        else:
            continue
        out.append(thinker_pb2.Tool(name=name, description=description,
                                    parameters_json=json.dumps(parameters)))
    return out


def build_tool_choice(choice: NotGivenOr[ToolChoice | None]) -> thinker_pb2.ToolChoice | None:
    """livekit's "auto" / "none" / "required" / {"type": "function", "function": {"name"}}
    -> the thinker's ToolChoice; None when not given (the thinker's default: AUTO)."""
    if not is_given(choice) or choice is None:
        return None
    if isinstance(choice, dict):
        return thinker_pb2.ToolChoice(function_name=choice["function"]["name"])
    if choice not in _TOOL_MODES:
        raise ValueError(f"tool_choice {choice!r} is not auto, none, required or a function")
    return thinker_pb2.ToolChoice(mode=_TOOL_MODES[choice])


def _audio_part(pcm: bytes) -> thinker_pb2.Part:
    return thinker_pb2.Part(audio=thinker_pb2.AudioPart(
        data=pcm, format=thinker_pb2.AUDIO_FORMAT_PCM_S16LE, sample_rate=16000))


def build_messages(
    chat_ctx: ChatContext, max_messages: int, utterances: UtteranceStore | None = None
) -> tuple[str, list[thinker_pb2.Message]]:
    """(system prompt, bounded message window) for a ChatRequest; user text that is an
    utterance marker (STT "audio" mode) becomes that utterance's audio: the newest, and
    any earlier one whose words the ear has not said yet (else those words)."""
    system: list[str] = []
    msgs: list[thinker_pb2.Message] = []
    users = [i for i, item in enumerate(chat_ctx.items)
             if item.type == "message" and item.role == "user"]
    newest = users[-1] if users else -1
    for index, item in enumerate(chat_ctx.items):
        if item.type == "function_call":
            call = thinker_pb2.ToolCall(id=item.call_id, name=item.name,
                                        arguments_json=item.arguments or "{}")
            if msgs and msgs[-1].role == thinker_pb2.ROLE_ASSISTANT:
                msgs[-1].tool_calls.append(call)  # the turn that said something, then called
            else:
                msgs.append(thinker_pb2.Message(role=thinker_pb2.ROLE_ASSISTANT,
                                                tool_calls=[call]))
            continue
        if item.type == "function_call_output":
            msgs.append(thinker_pb2.Message(role=thinker_pb2.ROLE_TOOL,
                                            tool_call_id=item.call_id,
                                            parts=[thinker_pb2.Part(text=item.output)]))
            continue
        if item.type != "message":
            continue  # handoffs and config updates are not part of the conversation
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
                words = (utterances.words(c) if stored and utterances is not None
                         and index != newest else None)
                if words:
                    parts.append(thinker_pb2.Part(text=words))
                elif stored:
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
        while msgs and msgs[0].role != thinker_pb2.ROLE_USER and len(msgs) > 1:
            msgs.pop(0)  # a cut window starts with the user, not half an exchange
    # A result goes out only with its call (the thinker refuses an unmatched one).
    called: set[str] = set()
    kept = []
    for m in msgs:
        called.update(c.id for c in m.tool_calls)
        if m.role != thinker_pb2.ROLE_TOOL or m.tool_call_id in called:
            kept.append(m)
    return "\n".join(system), kept


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
        self.last_stream: LLMStream | None = None  # its usage and why it ended (Realtime)

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
        # a call's limits are the LLM's when it is made (`update_options`), none per call
        if is_given(extra_kwargs) and extra_kwargs:
            raise ValueError(f"extra_kwargs are not taken ({sorted(extra_kwargs)}): "
                             "set the LLM's options (update_options)")
        s = LLMStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options,
                      tool_choice=tool_choice)
        self._streams.add(s)
        self.last_stream = s
        return s

    def update_options(self, *, max_tokens: int | None = None,
                       temperature: float | None = None) -> None:
        """The next calls' limits (a Realtime session's, or its next response's)."""
        changes = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature))
                   if v is not None}
        self._opts = dataclasses.replace(self._opts, **changes)  # type: ignore[arg-type]

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
                 conn_options: APIConnectOptions,
                 tool_choice: NotGivenOr[Any] = NOT_GIVEN) -> None:
        super().__init__(llm_, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)
        self._llm_: LLM = llm_
        self._tool_choice = tool_choice
        self._opts = llm_._opts  # as they are when the call is made
        self._call: grpc.aio.UnaryStreamCall | None = None
        self.cancelled_by_barge_in = False
        self.text = ""
        self.request_id = ""
        self.cut_by_length = False  # the thinker stopped at its token limit
        self.usage: llm.CompletionUsage | None = None

    def cancel(self) -> bool:
        """Cancel the gRPC call (the thinker aborts the generation). True if it was live."""
        call = self._call
        if call is None or call.done():
            return False
        self.cancelled_by_barge_in = True
        return bool(call.cancel())

    async def _run(self) -> None:
        opts = self._opts
        tracker = self._llm_._tracker
        request_id = self.request_id = tracker.llm_started() if tracker else utils.shortuuid()
        system, msgs = build_messages(self._chat_ctx, opts.max_messages,
                                      self._llm_._utterances)
        req = thinker_pb2.ChatRequest(messages=msgs, max_tokens=opts.max_tokens,
                                      temperature=opts.temperature, system_prompt=system,
                                      request_id=request_id, tools=build_tools(self._tools))
        try:
            choice = build_tool_choice(self._tool_choice)
        except (ValueError, KeyError, TypeError) as e:
            raise APIError(f"thinker Chat: {e}", retryable=False) from None
        if choice is not None:
            req.tool_choice.CopyFrom(choice)
        if opts.seed is not None:
            req.seed = opts.seed
        self._llm_.last_request = req
        stub = thinker_pb2_grpc.ThinkerStub(self._llm_._channels.get())
        # A whole reply's deadline, not the connect timeout: replies stream for seconds.
        call = stub.Chat(req, timeout=_REPLY_DEADLINE_S,
                         metadata=self._llm_._channels.metadata)
        self._call = call
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]
        try:
            async for delta in call:
                for piece in delta.tool_calls:
                    c = calls.setdefault(piece.index, ["", "", ""])
                    c[0], c[1] = c[0] or piece.id, c[1] or piece.name
                    c[2] += piece.arguments
                if delta.text:
                    if tracker is not None and not self.text:
                        tracker.llm_first_token()
                    self.text += delta.text
                    self._event_ch.send_nowait(llm.ChatChunk(
                        id=request_id,
                        delta=llm.ChoiceDelta(role="assistant", content=delta.text)))
                if delta.HasField("final"):
                    for _, (call_id, name, arguments) in sorted(calls.items()):
                        self._event_ch.send_nowait(llm.ChatChunk(
                            id=request_id, delta=llm.ChoiceDelta(
                                role="assistant", tool_calls=[llm.FunctionToolCall(
                                    call_id=call_id, name=name, arguments=arguments)])))
                    f = delta.final
                    self.cut_by_length = f.finish_reason == thinker_pb2.FINISH_REASON_LENGTH
                    self.usage = llm.CompletionUsage(
                        completion_tokens=f.completion_tokens, prompt_tokens=f.prompt_tokens,
                        total_tokens=f.prompt_tokens + f.completion_tokens)
                    self._event_ch.send_nowait(llm.ChatChunk(id=request_id, usage=self.usage))
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self.cancelled_by_barge_in:
                log.info("thinker call cancelled by barge-in request_id=%s", request_id)
                return
            if tracker is not None:
                tracker.error("llm", f"{e.code().name}: {e.details()}")
            raise to_api_error(e, "thinker Chat") from None
        finally:
            call.cancel()
