"""Every JSON shape the HTTP and WebSocket fronts accept and send, in one place.

Both fronts speak the gRPC contract's meaning through the call's own types
(`call/messages.py`): what they accept becomes a `SessionConfig` and requests
(`session_config`, `ws_request`), what they send is made from the call's output
(`ws_event`). The service README's
"HTTP and WebSocket" section documents these shapes; change them here and there together.

- `SpeechRequest`: the body of `POST /v1/audio/speech` (OpenAI's fields, then ours).
- WebSocket client messages (`parse_ws_message`): JSON text messages with a `type`, or a
  binary message, which is text as raw UTF-8 bytes (split anywhere, even inside a
  character, as `TextDelta.utf8`).
- WebSocket server messages: binary = one PCM frame (s16le, the session's rate and
  frame_ms); text = a JSON event (`ws_event`, `ws_error`).
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from voice_tts.server.call import messages
from voice_tts.server.call.messages import (
    Control,
    Event,
    FirstAudio,
    Output,
    Request,
    SessionConfig,
    SessionStarted,
    Text,
)

# --- shared --------------------------------------------------------------------------

# The proto's integer types: a JSON integer outside them is the client's mistake (400),
# as it is over gRPC.
U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
U64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
# Our largest valid message nests 3 deep ({"sampling": {...}}); the parser is never asked
# to recurse further.
MAX_JSON_DEPTH = 8
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a string, or a bracket


class _Fields(BaseModel):
    """Our JSON objects: unknown fields, NaN/Infinity and text that is not Unicode (a
    lone surrogate from a "\\ud800" escape) are errors that name the field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _unicode(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v.encode()
            except UnicodeEncodeError:
                raise ValueError("not valid Unicode text (a lone surrogate escape?)") from None
        return v


class Sampling(_Fields):
    """`SessionConfig.sampling`, field for field (unset: the model's defaults)."""

    greedy: bool | None = None
    temperature: float | None = None
    top_k: U32 | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_frames: U32 | None = None


class VoiceId(_Fields):
    """OpenAI's custom-voice form of `voice`: `{"id": "<name>"}` (a library voice)."""

    id: str


class SessionFields(_Fields):
    """What a session is spoken with: `SessionConfig` less the fields a front sets."""

    voice: str | VoiceId
    language: str = "auto"
    # The instruct text (1.7B models; the 0.6B ignores it, as the official code does).
    instructions: str = ""
    sample_rate: U32 = 24000
    seed: U64 | None = None
    sampling: Sampling | None = None


def load_json(text: str | bytes) -> Any:
    """json.loads with a nesting limit checked first (deep nesting would make the parser
    recurse to RecursionError); ValueError says what is wrong."""
    if isinstance(text, bytes):
        text = text.decode()  # UnicodeDecodeError is a ValueError
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested over {MAX_JSON_DEPTH} deep")
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{e.msg} at {e.pos}") from None


def session_config(f: SessionFields, frame_ms: int, session_id: str = "",
                   trace_id: str = "", **extra: Any) -> SessionConfig:
    """The call's config these fields mean (validated later by `protocol.resolve_config`,
    the one place its rules live); `extra`: more of its fields."""
    voice = f.voice if isinstance(f.voice, str) else f.voice.id
    sampling = messages.Sampling()
    if f.sampling is not None:
        sampling = messages.Sampling(**{k: _float32(v) if isinstance(v, float) else v
                               for k, v in f.sampling.model_dump(exclude_none=True).items()})
    return SessionConfig(voice=voice, language=f.language, instruct=f.instructions,
                         sample_rate=f.sample_rate, frame_ms=frame_ms, seed=f.seed,
                         sampling=sampling, session_id=session_id, trace_id=trace_id,
                         **extra)


def _float32(x: float) -> float:
    """x as the contract's `float` holds it (what gRPC's clients send: the same rules see
    the same value); past its range, infinite (as protobuf stores it)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def validation_message(e: ValidationError) -> tuple[str, str]:
    """(param, message) of the first problem, for an error body."""
    err = e.errors()[0]
    param = ".".join(str(p) for p in err["loc"])
    return param, f"{param or 'body'}: {err['msg']}"


# --- POST /v1/audio/speech -------------------------------------------------------------

# Formats OpenAI offers that we do not: each needs an encoder (ffmpeg / libmp3lame, opus,
# fdk-aac, flac) in the server, and a streamed lossy encoding adds its frame delay to the
# first byte. Encode on the client from pcm or wav.
UNSUPPORTED_FORMATS = ("mp3", "opus", "aac", "flac")


class SpeechRequest(SessionFields):
    """OpenAI's `CreateSpeechRequest` (`model`, `input`, `voice`, `response_format`,
    `speed`, `instructions`, `stream_format`), then our extras (`language`, `seed`,
    `sample_rate`, `sampling`, `stream`). Unknown fields are an error, not ignored."""

    model: str | None = None
    input: str
    response_format: str = "wav"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    # False: the whole audio is made first, then sent with its length (a WAV header with
    # exact sizes, Content-Length). True (default): bytes leave as the audio is made.
    stream: bool = True
    # Inline reference audio (Base checkpoints; vLLM-Omni's names): a WAV file as base64
    # or a `data:audio/wav;base64,` URL (never a URL to fetch), its transcript, and
    # x-vector-only mode. `voice` must then be "".
    ref_audio: str | None = None
    ref_text: str = ""
    x_vector_only_mode: bool = False


# --- WebSocket /v1/audio/speech/stream -------------------------------------------------


class WSConfig(SessionFields):
    """First message: the session. `frame_ms`: audio per binary message."""

    type: Literal["config"]
    frame_ms: U32 = 20
    session_id: str = ""
    trace_id: str = ""


class WSText(_Fields):
    """Append text to the current utterance (any split: mid-word is fine)."""

    type: Literal["text"]
    text: str


class WSControl(_Fields):
    """flush: speak what was appended (the utterance ends; answered by `flushed`);
    stop: drop everything unspoken (answered by `stopped`; no frame of it follows);
    reset: stop, and a fresh context (answered by `reset`);
    end: flush, then the server closes (1000) after the last frame and `flushed`."""

    type: Literal["flush", "stop", "reset", "end"]


WSMessage = Annotated[WSConfig | WSText | WSControl, Field(discriminator="type")]
_WS_MESSAGE: TypeAdapter[WSConfig | WSText | WSControl] = TypeAdapter(WSMessage)

_CONTROLS = {"flush": Control.FLUSH, "stop": Control.STOP, "reset": Control.RESET}


def parse_ws_message(data: str | bytes) -> WSConfig | WSText | WSControl | bytes:
    """A client message; raises ValueError (with what to fix) if it is not one. Bytes
    (a binary message) are text as UTF-8, returned as they are."""
    if isinstance(data, bytes):
        return data
    try:
        obj = load_json(data)
    except ValueError as e:
        raise ValueError(f"a text message must be JSON ({e})") from None
    if not isinstance(obj, dict) or "type" not in obj:
        raise ValueError('a message is a JSON object with a "type": config, text, flush, '
                         "stop, reset or end")
    try:
        return _WS_MESSAGE.validate_python(obj)
    except ValidationError as e:
        raise ValueError(validation_message(e)[1]) from None


def ws_request(msg: WSText | WSControl | bytes) -> Request | None:
    """The call's request a message after the config means (None: `end`, a half-close)."""
    if isinstance(msg, bytes):
        return Text(msg)
    if isinstance(msg, WSText):
        return Text(msg.text)
    if msg.type == "end":
        return None
    return _CONTROLS[msg.type]


def ws_event(e: Output) -> dict[str, Any]:
    """An event of the call as the WebSocket's JSON event: `type`, `utterance_id`,
    `next_seq` (binary frames sent before it), and `config` (started) or `timings`
    (first_audio)."""
    if isinstance(e, Event):
        return {"type": e.kind.value, "utterance_id": e.utterance_id, "next_seq": e.next_seq}
    if isinstance(e, FirstAudio):
        t = e.timings
        return {"type": "first_audio", "utterance_id": e.utterance_id,
                "next_seq": e.next_seq, "timings": {
                    "ttfa_ms": t.ttfa_ms, "queue_ms": t.queue_ms, "prefill_ms": t.prefill_ms,
                    "first_packet_ms": t.first_packet_ms, "text_chars": t.text_chars}}
    assert isinstance(e, SessionStarted), e
    c = e.config
    config = {"voice": c.voice, "language": c.language, "instructions": c.instruct,
              "sample_rate": c.sample_rate, "frame_ms": c.frame_ms,
              "session_id": c.session_id, "trace_id": c.trace_id, "encoding": "pcm_s16le"}
    if c.seed is not None:
        config["seed"] = c.seed
    return {"type": "started", "utterance_id": 0, "next_seq": 0, "config": config}


def ws_error(code: str, message: str) -> dict[str, Any]:
    """The last event of a session that failed (then the socket closes, `close_code`)."""
    return {"type": "error", "code": code, "message": message}
