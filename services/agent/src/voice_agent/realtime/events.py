"""The OpenAI Realtime API's wire, as far as `/v1/realtime` speaks it: the session's
configuration in both shapes (GA: `audio.input.format`, `output_modalities`; beta:
`input_audio_format`, `modalities`), the server events' names in both dialects (GA:
`response.output_audio.delta`, `conversation.item.added`; beta: `response.audio.delta`,
`conversation.item.created`), and error events with the documented error types. The
audio in events is audio_formats.py's.

A client that connects with `OpenAI-Beta: realtime=v1` (the beta SDKs, Pipecat's older
service) gets beta names and session shapes; every other client gets GA ones. Client
events have the same names in both. Knows nothing of sockets or the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import audio_formats
from ..audio_formats import decode_g711 as decode_g711  # the wire's codecs
from ..audio_formats import encode_g711 as encode_g711
from ..conversation import options
from ..conversation.items import new_id
from ..conversation.options import ConversationError, Options, TurnDetection, invalid

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
CLIENT_EVENTS = (
    "session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
    "input_audio_buffer.clear", "conversation.item.create", "conversation.item.delete",
    "conversation.item.truncate", "conversation.item.retrieve", "response.create",
    "response.cancel", "output_audio_buffer.clear",
)


RealtimeError = ConversationError  # an `error` event for the client; the session goes on


def error_event(e: RealtimeError, event_id: str | None = None) -> dict[str, Any]:
    return {"type": "error", "event_id": new_id("event"), "error": {
        "type": e.type, "code": e.code, "message": e.message, "param": e.param,
        "event_id": event_id}}


@dataclass
class SessionConfig(Options):
    """What `session.update` may set: the conversation's options and the wire's own
    (formats by their beta names)."""
    model: str = "voice-agent"
    input_format: str = "pcm16"
    output_format: str = "pcm16"
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
                "audio": {"input": {"format": audio_formats.MIME[self.input_format],
                                    "transcription": self.transcription,
                                    "turn_detection": td},
                          "output": {"format": audio_formats.MIME[self.output_format],
                                     "voice": self.voice}},
                "tools": self.tools, "tool_choice": self.tool_choice,
                "max_output_tokens": max_tokens}


def update_session(cfg: SessionConfig, s: Any, agent_turn: TurnDetection) -> SessionConfig:
    """`session.update`'s session (either shape) applied to `cfg`; a RealtimeError names
    the first bad field and changes nothing. `agent_turn`: a client's unset values."""
    if not isinstance(s, dict):
        raise invalid("session must be an object", "session")
    u = options.overrides(s, cfg, "session", 20_000)
    audio = s.get("audio") if isinstance(s.get("audio"), dict) else {}
    inp = audio.get("input") if isinstance(audio.get("input"), dict) else {}
    out = audio.get("output") if isinstance(audio.get("output"), dict) else {}
    for value in (s.get("voice"), out.get("voice")):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise invalid("voice must be a voice's name", "session.voice")
            u["voice"] = value
    for key, param, value in (
            ("input_format", "session.input_audio_format", s.get("input_audio_format")),
            ("input_format", "session.audio.input.format", inp.get("format")),
            ("output_format", "session.output_audio_format", s.get("output_audio_format")),
            ("output_format", "session.audio.output.format", out.get("format"))):
        if value is not None:
            u[key] = audio_formats.parse(value, param)
    for src in (s, inp):
        if "turn_detection" in src:
            u["turn_detection"] = options.turn_detection(
                src["turn_detection"], cfg.turn_detection or agent_turn,
                "session.turn_detection")
    for src, key in ((s, "input_audio_transcription"), (inp, "transcription")):
        if key in src:
            u["transcription"] = src[key] if isinstance(src[key], dict) else None
    return replace(cfg, **u)


def event_name(ga_name: str, beta: bool) -> str | None:
    """A server event's name for a GA or a beta client; None: beta has no such event."""
    if beta:
        return None if ga_name in _GA_ONLY else _BETA_NAMES.get(ga_name, ga_name)
    return ga_name


def beta_part(part: dict[str, Any]) -> dict[str, Any]:
    """A reply's content part for a beta client: "audio" / "text" (GA: "output_audio")."""
    return {**part, "type": part["type"].removeprefix("output_")}
