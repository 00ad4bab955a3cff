"""All checks on a ChatRequest, in one place: proto in, a validated `ChatJob` out.

Every rule the contract states (thinker.proto) is enforced here and raises InvalidInput
with a message naming the field; errors.status_for turns that into INVALID_ARGUMENT.
Limits that need a tokenizer (prompt tokens vs max_model_len) are the backend's, and
raise the same error kind. This module knows gRPC messages, not gRPC calls.
"""

from __future__ import annotations

import math
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
)
from voice_llm.errors import InvalidInput
from voice_llm.settings import Settings

_ROLES = {pb.ROLE_SYSTEM: Role.SYSTEM, pb.ROLE_USER: Role.USER, pb.ROLE_ASSISTANT: Role.ASSISTANT}
_FORMATS = {pb.AUDIO_FORMAT_PCM_S16LE: PCM, pb.AUDIO_FORMAT_WAV: WAV}
_FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH}
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

    chars = sum(len(m.text) for m in messages)
    if chars > settings.max_input_chars:
        raise InvalidInput(
            f"input text is {chars} characters, over the limit of {settings.max_input_chars}"
        )
    seconds = sum(a.seconds for m in messages for a in m.audio)
    if seconds > settings.max_audio_seconds:
        raise InvalidInput(
            f"input audio is {seconds:.1f} s, over the limit of {settings.max_audio_seconds:g} s"
        )
    return ChatJob(request_id, tuple(messages), _options(req, settings))


def _message(msg: pb.Message, where: str) -> ChatMessage:
    role = _ROLES.get(msg.role)
    if role is None:
        name = pb.Role.Name(msg.role) if msg.role in pb.Role.values() else str(msg.role)
        raise InvalidInput(f"{where}.role {name} is not one of SYSTEM, USER, ASSISTANT")
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
    if not has_audio and not "".join(p for p in parts if isinstance(p, str)).strip():
        raise InvalidInput(f"{where} is empty: its text parts are all blank and it has no audio")
    return ChatMessage(role, tuple(parts))


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
