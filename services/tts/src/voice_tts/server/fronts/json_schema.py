"""Every JSON shape the HTTP and WebSocket fronts accept and send, in one place.

Both fronts speak the gRPC contract underneath: what they accept becomes a
`SessionConfig` and `SynthesizeRequest`s (`session_config`, `WS_REQUESTS`), what they send
is made from the `SynthesizeResponse`s of the same call (`ws_event`). The service README's
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
import re
from typing import Annotated, Any, Literal

from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from voice.tts.v1 import tts_pb2

# --- shared --------------------------------------------------------------------------

# The proto's integer types: a JSON integer outside them is the client's mistake (400),
# not an overflow when the SessionConfig is built.
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
                   trace_id: str = "") -> tts_pb2.SessionConfig:
    """The gRPC config these fields mean (validated later by `protocol.resolve_config`,
    the one place its rules live)."""
    voice = f.voice if isinstance(f.voice, str) else f.voice.id
    cfg = tts_pb2.SessionConfig(voice=voice, language=f.language, instruct=f.instructions,
                                sample_rate=f.sample_rate, frame_ms=frame_ms,
                                session_id=session_id, trace_id=trace_id)
    if f.seed is not None:
        cfg.seed = f.seed
    if f.sampling is not None:
        for name, value in f.sampling.model_dump(exclude_none=True).items():
            setattr(cfg.sampling, name, value)
    return cfg


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

_CONTROLS = {"flush": tts_pb2.Control.FLUSH, "stop": tts_pb2.Control.STOP,
             "reset": tts_pb2.Control.RESET}


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


def ws_request(msg: WSText | WSControl | bytes) -> tts_pb2.SynthesizeRequest | None:
    """The gRPC request a message after the config means (None: `end`, a half-close)."""
    if isinstance(msg, bytes):
        return tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(utf8=msg))
    if isinstance(msg, WSText):
        return tts_pb2.SynthesizeRequest(text=tts_pb2.TextDelta(text=msg.text))
    if msg.type == "end":
        return None
    return tts_pb2.SynthesizeRequest(control=tts_pb2.Control(type=_CONTROLS[msg.type]))


_EVENT_NAMES = {
    tts_pb2.Event.SESSION_STARTED: "started",
    tts_pb2.Event.FIRST_AUDIO: "first_audio",
    tts_pb2.Event.FLUSHED: "flushed",
    tts_pb2.Event.STOPPED: "stopped",
    tts_pb2.Event.RESET: "reset",
    tts_pb2.Event.TRUNCATED: "truncated",
}


def ws_event(e: tts_pb2.Event) -> dict[str, Any]:
    """A gRPC event as the WebSocket's JSON event: `type`, `utterance_id`, `next_seq`
    (binary frames sent before it), and `config` (started) or `timings` (first_audio)."""
    out: dict[str, Any] = {"type": _EVENT_NAMES[e.type], "utterance_id": e.utterance_id,
                           "next_seq": e.next_seq}
    if e.type == tts_pb2.Event.SESSION_STARTED:
        c = e.config
        out["config"] = {"voice": c.voice, "language": c.language,
                         "instructions": c.instruct, "sample_rate": c.sample_rate,
                         "frame_ms": c.frame_ms, "session_id": c.session_id,
                         "trace_id": c.trace_id, "encoding": "pcm_s16le"}
        if c.HasField("seed"):
            out["config"]["seed"] = c.seed
    elif e.type == tts_pb2.Event.FIRST_AUDIO:
        out["timings"] = MessageToDict(e.timings, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True)
    return out


def ws_error(code: str, message: str) -> dict[str, Any]:
    """The last event of a session that failed (then the socket closes, `close_code`)."""
    return {"type": "error", "code": code, "message": message}
