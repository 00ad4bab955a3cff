"""All checks on a ChatRequest, in one place: proto in, a validated `ChatJob` out.

Every rule the contract states (thinker.proto) is enforced here and raises InvalidInput
with a message naming the field; errors.status_for turns that into INVALID_ARGUMENT.
Limits that need a tokenizer (prompt tokens vs max_model_len) are the backend's, and
raise the same error kind. This module knows gRPC messages, not gRPC calls.
"""

from __future__ import annotations

import json
import math
import re
import uuid

from google.protobuf.message import DecodeError
from voice.llm.v1 import thinker_pb2 as pb

from voice_llm.audio import PCM, WAV, decode_audio
from voice_llm.chat import (
    AudioClip,
    ChatJob,
    ChatMessage,
    FinishReason,
    Part,
    Role,
    SamplingOptions,
    ToolCall,
    ToolChoice,
    ToolMode,
    ToolSpec,
)
from voice_llm.errors import InvalidInput
from voice_llm.settings import Settings

_ROLES = {pb.ROLE_SYSTEM: Role.SYSTEM, pb.ROLE_USER: Role.USER,
          pb.ROLE_ASSISTANT: Role.ASSISTANT, pb.ROLE_TOOL: Role.TOOL}
_FORMATS = {pb.AUDIO_FORMAT_PCM_S16LE: PCM, pb.AUDIO_FORMAT_WAV: WAV}
_FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS}
_TOOL_MODES = {pb.TOOL_CHOICE_MODE_UNSPECIFIED: ToolMode.AUTO, pb.TOOL_CHOICE_MODE_AUTO:
               ToolMode.AUTO, pb.TOOL_CHOICE_MODE_NONE: ToolMode.NONE,
               pb.TOOL_CHOICE_MODE_REQUIRED: ToolMode.REQUIRED}
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 32
MAX_TOOL_CALLS = 16  # in one assistant message
MAX_CALL_ID_CHARS = 64
MAX_SCHEMA_CHARS = 16_384
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 64
MAX_REQUEST_ID_CHARS = 128


def parse_chat_request(raw: bytes) -> pb.ChatRequest:
    """The request's bytes (Chat is registered without a deserializer, so that bytes that
    are not a ChatRequest, or a string field that is not UTF-8, are INVALID_ARGUMENT with
    a reason, not grpc's UNKNOWN)."""
    try:
        return pb.ChatRequest.FromString(raw)
    except DecodeError as e:
        raise InvalidInput(f"unparsable ChatRequest ({e}); string fields must be valid "
                           "UTF-8 (audio goes in AudioPart.data)") from None


def request_id_of(req: pb.ChatRequest) -> str:
    """The client's id if it gave one (echoed for tracing), else a fresh one."""
    rid = req.request_id.strip()
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise InvalidInput(f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters")
    return rid or f"chat-{uuid.uuid4().hex[:16]}"


def to_job(req: pb.ChatRequest, request_id: str, settings: Settings) -> ChatJob:
    if not req.messages:
        raise InvalidInput("messages is empty: send at least one message")
    n_messages = len(req.messages) + (1 if req.system_prompt else 0)
    if n_messages > settings.max_messages:
        raise InvalidInput(f"{n_messages} messages is over the limit of {settings.max_messages}")

    messages: list[ChatMessage] = []
    if req.system_prompt.strip():
        messages.append(ChatMessage(Role.SYSTEM, (req.system_prompt,)))
    for i, msg in enumerate(req.messages):
        messages.append(_message(msg, f"messages[{i}]"))
    _check_call_ids(messages, 1 if req.system_prompt.strip() else 0)
    tools = _tools(req)
    choice = _tool_choice(req, tools)

    chars = sum(len(m.text) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
    if chars > settings.max_input_chars:
        raise InvalidInput(
            f"input text is {chars} characters, over the limit of {settings.max_input_chars}"
        )
    seconds = sum(a.seconds for m in messages for a in m.audio)
    if seconds > settings.max_audio_seconds:
        raise InvalidInput(
            f"input audio is {seconds:.1f} s, over the limit of {settings.max_audio_seconds:g} s"
        )
    return ChatJob(request_id, tuple(messages), _options(req, settings), tools, choice)


def _tools(req: pb.ChatRequest) -> tuple[ToolSpec, ...]:
    if len(req.tools) > MAX_TOOLS:
        raise InvalidInput(f"{len(req.tools)} tools is over the limit of {MAX_TOOLS}")
    tools: list[ToolSpec] = []
    seen: set[str] = set()
    for i, t in enumerate(req.tools):
        where = f"tools[{i}]"
        if not _TOOL_NAME.fullmatch(t.name):
            raise InvalidInput(f"{where}.name {t.name[:80]!r} must be 1-64 of A-Z a-z 0-9 _ -")
        if t.name in seen:
            raise InvalidInput(f"{where}.name {t.name!r} is a duplicate: tool names are unique")
        seen.add(t.name)
        tools.append(ToolSpec(t.name, t.description, _schema(t.parameters_json, where)))
    return tuple(tools)


def _schema(text: str, where: str) -> dict:
    """A tool's parameters: a valid JSON Schema (jsonschema's metaschema check) for an
    object; empty = no arguments."""
    if not text.strip():
        return {"type": "object", "properties": {}}
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidInput(f"{where}.parameters_json is over {MAX_SCHEMA_CHARS} characters")
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise InvalidInput(f"{where}.parameters_json is not JSON ({e})") from None
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidInput(f"{where}.parameters_json must be a JSON Schema of an object "
                           '({"type": "object", "properties": {...}})')
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as e:
        raise InvalidInput(f"{where}.parameters_json is not a valid JSON Schema: "
                           f"{e.message[:200]}") from None
    return schema


def _tool_choice(req: pb.ChatRequest, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    kind = req.tool_choice.WhichOneof("choice")
    if kind == "function_name":
        name = req.tool_choice.function_name
        if name not in {t.name for t in tools}:
            raise InvalidInput(f"tool_choice.function_name {name[:80]!r} is not one of tools")
        return ToolChoice(ToolMode.FUNCTION, name)
    mode = _TOOL_MODES.get(req.tool_choice.mode) if kind else ToolMode.AUTO
    if mode is None:
        raise InvalidInput(f"tool_choice.mode {req.tool_choice.mode} is not a ToolChoiceMode")
    if mode is ToolMode.REQUIRED and not tools:
        raise InvalidInput("tool_choice REQUIRED needs tools")
    return ToolChoice(mode)


def _check_call_ids(messages: list[ChatMessage], first: int) -> None:
    """Every tool result answers an earlier call; call ids are unique."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i - first}]"
        for c in m.tool_calls:
            if c.id in calls:
                raise InvalidInput(f"{where}: tool call id {c.id!r} is used twice")
            calls.add(c.id)
        if m.role is Role.TOOL and m.tool_call_id not in calls:
            raise InvalidInput(f"{where}: tool_call_id {m.tool_call_id!r} matches no tool "
                               "call of an earlier assistant message")


def _tool_calls(msg: pb.Message, role: Role, where: str) -> tuple[ToolCall, ...]:
    if not msg.tool_calls:
        return ()
    if role is not Role.ASSISTANT:
        raise InvalidInput(f"{where}: tool_calls are accepted in ASSISTANT messages only")
    if len(msg.tool_calls) > MAX_TOOL_CALLS:
        raise InvalidInput(f"{where}: {len(msg.tool_calls)} tool calls is over the limit of "
                           f"{MAX_TOOL_CALLS}")
    calls = []
    for k, c in enumerate(msg.tool_calls):
        at = f"{where}.tool_calls[{k}]"
        if not c.id or len(c.id) > MAX_CALL_ID_CHARS:
            raise InvalidInput(f"{at}.id must be 1..{MAX_CALL_ID_CHARS} characters")
        if not _TOOL_NAME.fullmatch(c.name):
            raise InvalidInput(f"{at}.name {c.name[:80]!r} must be 1-64 of A-Z a-z 0-9 _ -")
        try:
            args = json.loads(c.arguments_json or "{}")
        except ValueError as e:
            raise InvalidInput(f"{at}.arguments_json is not JSON ({e})") from None
        if not isinstance(args, dict):
            raise InvalidInput(f"{at}.arguments_json must be a JSON object")
        calls.append(ToolCall(c.id, c.name, json.dumps(args, ensure_ascii=False)))
    return tuple(calls)


def _message(msg: pb.Message, where: str) -> ChatMessage:
    role = _ROLES.get(msg.role)
    if role is None:
        name = pb.Role.Name(msg.role) if msg.role in pb.Role.values() else str(msg.role)
        raise InvalidInput(f"{where}.role {name} is not one of SYSTEM, USER, ASSISTANT, TOOL")
    calls = _tool_calls(msg, role, where)
    if msg.tool_call_id and role is not Role.TOOL:
        raise InvalidInput(f"{where}: tool_call_id is for TOOL messages only")
    if role is Role.TOOL:
        if not msg.tool_call_id:
            raise InvalidInput(f"{where}: a TOOL message needs tool_call_id (the call it "
                               "answers)")
        if any(p.WhichOneof("part") != "text" for p in msg.parts):
            raise InvalidInput(f"{where}: a TOOL message's parts are text only")
        return ChatMessage(role, ("".join(p.text for p in msg.parts),),
                           tool_call_id=msg.tool_call_id)
    if calls and not msg.parts:
        return ChatMessage(role, (), tool_calls=calls)
    if not msg.parts:
        raise InvalidInput(f"{where} has no parts")
    parts: list[Part] = []
    for j, part in enumerate(msg.parts):
        kind = part.WhichOneof("part")
        if kind == "text":
            parts.append(part.text)
        elif kind == "audio":
            if role is not Role.USER:
                raise InvalidInput(f"{where}.parts[{j}]: audio is accepted in USER messages only")
            parts.append(_audio(part.audio, f"{where}.parts[{j}]"))
        else:
            raise InvalidInput(f"{where}.parts[{j}] is empty (set text or audio)")
    has_audio = any(isinstance(p, AudioClip) for p in parts)
    blank = not "".join(p for p in parts if isinstance(p, str)).strip()
    if not has_audio and blank and not calls:
        raise InvalidInput(f"{where} is empty: its text parts are all blank and it has no audio")
    return ChatMessage(role, tuple(parts), tool_calls=calls)


def _audio(audio: pb.AudioPart, where: str) -> AudioClip:
    fmt = _FORMATS.get(audio.format)
    if fmt is None:
        raise InvalidInput(
            f"{where}: audio format {pb.AudioFormat.Name(audio.format)} is not PCM_S16LE or WAV"
        )
    return decode_audio(audio.data, fmt, audio.sample_rate, where)


def _options(req: pb.ChatRequest, settings: Settings) -> SamplingOptions:
    max_tokens = req.max_tokens or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise InvalidInput(
            f"max_tokens {max_tokens} is over the server's limit of {settings.max_tokens_limit}"
        )
    temperature = req.temperature if req.HasField("temperature") else settings.default_temperature
    if not (math.isfinite(temperature) and 0.0 <= temperature <= 2.0):
        raise InvalidInput(f"temperature must be in [0, 2], got {temperature}")
    top_p = req.top_p if req.HasField("top_p") else 1.0
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise InvalidInput(f"top_p must be in (0, 1], got {top_p}")
    if len(req.stop) > MAX_STOP_STRINGS:
        raise InvalidInput(f"{len(req.stop)} stop strings is over the limit of {MAX_STOP_STRINGS}")
    for s in req.stop:
        if not s or len(s) > MAX_STOP_CHARS:
            raise InvalidInput(f"stop strings must be 1..{MAX_STOP_CHARS} characters, got {s!r}")
    seed = req.seed if req.HasField("seed") else None
    return SamplingOptions(max_tokens, float(temperature), float(top_p), tuple(req.stop), seed)


def final_delta(
    request_id: str,
    finish: FinishReason,
    prompt_tokens: int,
    completion_tokens: int,
    ttft_ms: float,
    total_ms: float,
    text: str = "",
) -> pb.ChatDelta:
    return pb.ChatDelta(
        request_id=request_id,
        text=text,
        final=pb.ChatFinal(
            finish_reason=_FINISH[finish],
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            ttft_ms=ttft_ms,
            total_ms=total_ms,
        ),
    )


def tool_call_delta(request_id: str, index: int, call: ToolCall) -> pb.ChatDelta:
    """A whole call in one delta (id, name and all of its arguments)."""
    return pb.ChatDelta(request_id=request_id, tool_calls=[pb.ToolCallDelta(
        index=index, id=call.id, name=call.name, arguments=call.arguments)])
