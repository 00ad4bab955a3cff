"""The OpenAI Realtime API's wire, as far as `/v1/realtime` speaks it: the session's
configuration in both shapes (GA: `audio.input.format`, `output_modalities`; beta:
`input_audio_format`, `modalities`), the server events' names in both dialects (GA:
`response.output_audio.delta`, `conversation.item.added`; beta: `response.audio.delta`,
`conversation.item.created`), error events with the documented error types, and G.711.

A client that connects with `OpenAI-Beta: realtime=v1` (the beta SDKs, Pipecat's older
service) gets beta names and session shapes; every other client gets GA ones. Client
events have the same names in both. Knows nothing of sockets or the pipeline.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..conversation.turn_end import EAGERNESS

RATE = 24000  # pcm16 in and out, as the API defines it
G711_RATE = 8000
MAX_APPEND_BYTES = 15 * 1024 * 1024  # one input_audio_buffer.append's base64 (OpenAI's)

# GA name -> beta name, where they differ (server events only)
_BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
_GA_ONLY = {"conversation.item.done"}  # beta has no such event
_GA_FORMATS = {"pcm16": {"type": "audio/pcm", "rate": RATE}, "g711_ulaw": {"type": "audio/pcmu"},
               "g711_alaw": {"type": "audio/pcma"}}
_FORMATS_BY_GA_TYPE = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
CLIENT_EVENTS = (
    "session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
    "input_audio_buffer.clear", "conversation.item.create", "conversation.item.delete",
    "conversation.item.truncate", "conversation.item.retrieve", "response.create",
    "response.cancel", "output_audio_buffer.clear",
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class RealtimeError(Exception):
    """An `error` event for the client; the session goes on. `type` is one of the API's
    documented error types (invalid_request_error, server_error)."""

    def __init__(self, code: str, message: str, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.type = code, message, param, type_


def error_event(e: RealtimeError, event_id: str | None = None) -> dict[str, Any]:
    return {"type": "error", "event_id": new_id("event"), "error": {
        "type": e.type, "code": e.code, "message": e.message, "param": e.param,
        "event_id": event_id}}


@dataclass
class TurnDetection:
    """Server VAD, as `server_vad` or `semantic_vad`: both end a turn by the agent's one
    end-of-turn policy (conversation/turn_end.py); `semantic_vad`'s eagerness scales its
    waits, `server_vad`'s threshold and silence tune the VAD. Unset values are the agent's
    (AGENT_VAD_*), reported as they are."""
    threshold: float
    silence_duration_ms: int
    prefix_padding_ms: int = 300
    create_response: bool = True
    interrupt_response: bool = True
    type: str = "server_vad"
    eagerness: str = "auto"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "semantic_vad":
            out["eagerness"] = self.eagerness
        else:
            out.update(threshold=self.threshold, silence_duration_ms=self.silence_duration_ms,
                       prefix_padding_ms=self.prefix_padding_ms)
        return {**out, "create_response": self.create_response,
                "interrupt_response": self.interrupt_response}


@dataclass
class SessionConfig:
    """What `session.update` may set, in the API's terms (formats by their beta names)."""
    instructions: str
    voice: str
    turn_detection: TurnDetection | None
    agent_turn: TurnDetection  # the agent's own VAD settings: a client's unset values
    model: str = "voice-agent"
    input_format: str = "pcm16"
    output_format: str = "pcm16"
    modalities: tuple[str, ...] = ("audio",)  # ("text",) for text-only replies
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None
    max_output_tokens: int | None = None  # None: the agent's AGENT_LLM_MAX_TOKENS
    transcription: dict[str, Any] | None = None

    def as_json(self, session_id: str, beta: bool) -> dict[str, Any]:
        td = self.turn_detection.as_json() if self.turn_detection else None
        max_tokens: int | str = self.max_output_tokens or "inf"
        if beta:
            return {"id": session_id, "object": "realtime.session", "model": self.model,
                    "modalities": (["text", "audio"] if "audio" in self.modalities
                                   else ["text"]),
                    "instructions": self.instructions, "voice": self.voice,
                    "input_audio_format": self.input_format,
                    "output_audio_format": self.output_format,
                    "input_audio_transcription": self.transcription, "turn_detection": td,
                    "tools": self.tools, "tool_choice": self.tool_choice,
                    "temperature": self.temperature,
                    "max_response_output_tokens": max_tokens}
        return {"id": session_id, "object": "realtime.session", "type": "realtime",
                "model": self.model, "output_modalities": list(self.modalities),
                "instructions": self.instructions,
                "audio": {"input": {"format": _GA_FORMATS[self.input_format],
                                    "transcription": self.transcription,
                                    "turn_detection": td},
                          "output": {"format": _GA_FORMATS[self.output_format],
                                     "voice": self.voice}},
                "tools": self.tools, "tool_choice": self.tool_choice,
                "max_output_tokens": max_tokens}


def _shown(value: Any) -> str:
    """A client's value quoted in an error message, cut short."""
    return repr(value)[:80]


def _format(value: Any, param: str) -> str:
    """A format in either shape: "pcm16" / "g711_ulaw" (beta), {"type": "audio/pcm"} (GA)."""
    if isinstance(value, dict):
        t = value.get("type")
        if not isinstance(t, str) or t not in _FORMATS_BY_GA_TYPE:
            raise RealtimeError("invalid_value", f"{param}.type must be one of "
                                f"{sorted(_FORMATS_BY_GA_TYPE)}, not {_shown(t)}",
                                f"{param}.type")
        if t == "audio/pcm" and value.get("rate", RATE) != RATE:
            raise RealtimeError("invalid_value", f"{param}.rate must be {RATE}", f"{param}.rate")
        return _FORMATS_BY_GA_TYPE[t]
    if not isinstance(value, str) or value not in _GA_FORMATS:
        raise RealtimeError("invalid_value", f"{param} must be one of {sorted(_GA_FORMATS)} "
                            f"(or a GA format object), not {_shown(value)}", param)
    return value


def finite_number(v: Any) -> bool:
    """A JSON number the session can use: not a bool, not NaN or infinite."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _turn_detection(value: Any, old: TurnDetection | None,
                    default: TurnDetection) -> TurnDetection | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RealtimeError("invalid_value", "turn_detection must be an object or null",
                            "session.turn_detection")
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise RealtimeError("invalid_value", "turn_detection.type must be server_vad or "
                            f"semantic_vad, not {kind!r}", "session.turn_detection.type")
    td = old or default
    updates: dict[str, Any] = {"type": kind}
    if "eagerness" in value and value["eagerness"] is not None:
        if not isinstance(value["eagerness"], str) or value["eagerness"] not in EAGERNESS:
            raise RealtimeError("invalid_value", "turn_detection.eagerness must be one of "
                                f"{sorted(EAGERNESS)}, not {_shown(value['eagerness'])}",
                                "session.turn_detection.eagerness")
        updates["eagerness"] = value["eagerness"]
    for key, kind_ in (("threshold", float), ("silence_duration_ms", int),
                       ("prefix_padding_ms", int), ("create_response", bool),
                       ("interrupt_response", bool)):
        if key in value and value[key] is not None:
            v = value[key]
            if not (isinstance(v, bool) if kind_ is bool else finite_number(v)):
                raise RealtimeError("invalid_value", f"turn_detection.{key} must be a "
                                    f"{kind_.__name__}", f"session.turn_detection.{key}")
            updates[key] = kind_(v)
    if not 0.0 <= updates.get("threshold", td.threshold) <= 1.0:
        raise RealtimeError("invalid_value", "turn_detection.threshold must be in [0, 1]",
                            "session.turn_detection.threshold")
    if not 0 <= updates.get("silence_duration_ms", td.silence_duration_ms) <= 10_000:
        raise RealtimeError("invalid_value", "turn_detection.silence_duration_ms must be "
                            "in [0, 10000]", "session.turn_detection.silence_duration_ms")
    if not 0 <= updates.get("prefix_padding_ms", td.prefix_padding_ms) <= 10_000:
        raise RealtimeError("invalid_value", "turn_detection.prefix_padding_ms must be "
                            "in [0, 10000]", "session.turn_detection.prefix_padding_ms")
    return replace(td, **updates)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RealtimeError("invalid_value", "tools must be a list", "session.tools")
    names: set[str] = set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise RealtimeError("invalid_value", "only function tools are supported "
                                '({"type": "function", "name", "description", "parameters"})',
                                f"session.tools[{i}]")
        name = t.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise RealtimeError("invalid_value", "each tool needs a unique name",
                                f"session.tools[{i}].name")
        if not isinstance(t.get("description", ""), str):
            raise RealtimeError("invalid_value", "a tool's description must be a string",
                                f"session.tools[{i}].description")
        if not isinstance(t.get("parameters", {}), dict):
            raise RealtimeError("invalid_value", "a tool's parameters must be a JSON Schema "
                                "object", f"session.tools[{i}].parameters")
        names.add(name)
    return [{"type": "function", "name": t["name"], "description": t.get("description", ""),
             "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
            for t in tools]


def check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        # GA: {"type": "function", "name"}; Chat Completions' shape: {"function": {"name"}}
        fn = choice.get("function")
        name = choice.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
        if not isinstance(name, str) or name not in {t["name"] for t in tools}:
            raise RealtimeError("invalid_value", f"tool_choice names {_shown(name)}, which is "
                                "not among the session's tools", "session.tool_choice")
        return {"type": "function", "name": name}
    raise RealtimeError("invalid_value", 'tool_choice must be "auto", "none", "required" or '
                        '{"type": "function", "name": ...}', "session.tool_choice")


def check_modalities(mods: Any, param: str) -> tuple[str, ...]:
    """["audio"] (a transcript comes with it), ["text"], or both (= audio)."""
    if not isinstance(mods, list) or not mods or \
            not all(isinstance(m, str) and m in ("text", "audio") for m in mods):
        raise RealtimeError("invalid_value", f'{param} must be ["audio"] or ["text"]', param)
    return ("audio",) if "audio" in mods else ("text",)


def max_tokens(value: Any, param: str) -> int | None:
    if value in (None, "inf"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise RealtimeError("invalid_value", f'{param} must be 1..4096 or "inf"', param)
    return value


def update_session(cfg: SessionConfig, s: Any) -> SessionConfig:
    """`session.update`'s session (either shape) applied to `cfg`; a RealtimeError names
    the first bad field and changes nothing."""
    if not isinstance(s, dict):
        raise RealtimeError("invalid_value", "session must be an object", "session")
    u: dict[str, Any] = {}
    if "instructions" in s:
        if not isinstance(s["instructions"], str) or len(s["instructions"]) > 20_000:
            raise RealtimeError("invalid_value", "instructions must be a string of at most "
                                "20,000 characters", "session.instructions")
        u["instructions"] = s["instructions"]
    audio = s.get("audio") if isinstance(s.get("audio"), dict) else {}
    inp = audio.get("input") if isinstance(audio.get("input"), dict) else {}
    out = audio.get("output") if isinstance(audio.get("output"), dict) else {}
    for key, value in (("voice", s.get("voice")), ("voice", out.get("voice"))):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise RealtimeError("invalid_value", "voice must be a voice's name",
                                    "session.voice")
            u[key] = value
    for key, param, value in (
            ("input_format", "session.input_audio_format", s.get("input_audio_format")),
            ("input_format", "session.audio.input.format", inp.get("format")),
            ("output_format", "session.output_audio_format", s.get("output_audio_format")),
            ("output_format", "session.audio.output.format", out.get("format"))):
        if value is not None:
            u[key] = _format(value, param)
    for key in ("output_modalities", "modalities"):
        if key in s:
            u["modalities"] = check_modalities(s[key], f"session.{key}")
    for src in (s, inp):
        if "turn_detection" in src:
            u["turn_detection"] = _turn_detection(src["turn_detection"], cfg.turn_detection,
                                                  cfg.agent_turn)
    for src, key in ((s, "input_audio_transcription"), (inp, "transcription")):
        if key in src:
            u["transcription"] = src[key] if isinstance(src[key], dict) else None
    tools = check_tools(s["tools"]) if "tools" in s else cfg.tools
    if "tools" in s:
        u["tools"] = tools
    if "tool_choice" in s:
        u["tool_choice"] = check_tool_choice(s["tool_choice"], tools)
    if "temperature" in s and s["temperature"] is not None:
        t = s["temperature"]
        if not finite_number(t) or not 0.0 <= t <= 2.0:
            raise RealtimeError("invalid_value", "temperature must be in [0, 2]",
                                "session.temperature")
        u["temperature"] = float(t)
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in s:
            u["max_output_tokens"] = max_tokens(s[key], f"session.{key}")
    return replace(cfg, **u)


class Dialect:
    """Server event names and content-part types for a GA or a beta client."""

    def __init__(self, beta: bool) -> None:
        self.beta = beta

    def name(self, ga_name: str) -> str | None:
        """The event's name for this client; None: this client has no such event."""
        if self.beta:
            return None if ga_name in _GA_ONLY else _BETA_NAMES.get(ga_name, ga_name)
        return ga_name

    def part(self, kind: str) -> str:
        """A reply's content part type: "audio" / "text" (beta), "output_audio" (GA)."""
        return kind if self.beta else f"output_{kind}"


# G.711 (ITU-T): each of the 256 codes decoded once; encoding picks the nearest code.
def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, ((a & 0x0F) << 4) + 8, (((a & 0x0F) << 4) + 0x108) << (seg - 1))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_TABLES = {"g711_ulaw": _ulaw_table(), "g711_alaw": _alaw_table()}
_ORDER = {k: np.argsort(t, kind="stable") for k, t in _TABLES.items()}


def decode_g711(data: bytes, fmt: str) -> np.ndarray:
    return _TABLES[fmt][np.frombuffer(data, dtype=np.uint8)]


def encode_g711(pcm: np.ndarray, fmt: str) -> bytes:
    table, order = _TABLES[fmt], _ORDER[fmt]
    s = table[order]
    i = np.clip(np.searchsorted(s, pcm), 1, len(s) - 1)
    x = pcm.astype(np.int32)
    nearer = np.where(np.abs(x - s[i - 1]) <= np.abs(s[i].astype(np.int32) - x), i - 1, i)
    return order[nearer].astype(np.uint8).tobytes()
