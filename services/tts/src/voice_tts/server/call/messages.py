"""The call's own language: what a client sends (`Request`) and what the call gives back
(`Output`), whatever the protocol. The fronts translate: gRPC (`fronts/service.py`) parses
`SynthesizeRequest`s into these and writes these as `SynthesizeResponse`s; the HTTP and
WebSocket fronts build and read them from their JSON. Protobuf stays in the gRPC adapter.

In: a `SessionConfig` first (validated and defaulted by `protocol.resolve_config` into a
`ResolvedConfig`), then `Text` appends and `Control`s; the end of the iterator is the
half-close (FLUSH, then the call ends). A message a front cannot parse raises `CallError`
out of its iterator. Out: `SessionStarted`, then `AudioFrame`s and `Event`s in wire order
(`FirstAudio` before an utterance's first frame); a failure ends the call with one
`CallError` (`errors.py`).

The hot path: an `AudioFrame` is the stream's own queue entry (made once when its audio is
framed; `seq` is set when it is written), so a frame costs the fronts no copy of its PCM
and no object beyond their own message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from voice_tts.engine import SamplingParams
from voice_tts.server.voices.reference_audio import ReferenceAudio

# --- in ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling overrides as the client sent them (None: the model's default)."""

    greedy: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_frames: int = 0  # 0: the server's guard


@dataclass(frozen=True, slots=True)
class Reference:
    """Inline reference audio: a clone for this session only."""

    audio: ReferenceAudio
    ref_text: str = ""
    x_vector_only: bool = False


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """The session as the client asked for it (0 / "": the default)."""

    voice: str = ""
    language: str = ""
    instruct: str = ""
    sample_rate: int = 0
    frame_ms: int = 0
    encoding: str = ""  # "" or "pcm_s16le"; anything else is refused
    seed: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    session_id: str = ""
    trace_id: str = ""
    frames_per_message: int = 0
    reference: Reference | None = None


@dataclass(frozen=True, slots=True)
class Text:
    """Text appended to the current utterance: `str` (whole characters) or `bytes` (raw
    UTF-8, split anywhere)."""

    text: str | bytes


class Control(enum.Enum):
    """FLUSH: speak what was appended (answered by FLUSHED); STOP: drop everything
    unspoken (STOPPED); RESET: stop, and a fresh context (RESET)."""

    FLUSH = "flush"
    STOP = "stop"
    RESET = "reset"


Request = SessionConfig | Text | Control


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """A `SessionConfig` validated, with every default filled in (`protocol.py`)."""

    voice: str
    language: str
    instruct: str
    sample_rate: int
    frame_ms: int
    frames_per_message: int  # frames an AudioFrame may hold (1: one each)
    seed: int | None
    sampling: SamplingParams  # the engine's
    max_frames: int
    session_id: str
    trace_id: str
    requested_sampling: Sampling = field(default_factory=Sampling)  # as sent (echoed)


# --- out -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The first output: the config the session runs with."""

    config: ResolvedConfig


@dataclass(slots=True)
class AudioFrame:
    """`frames` frames of one utterance (s16le at the session's rate), the first being
    frame `index` of its utterance; `seq` is its first frame's index over the stream
    (contiguous from 0), set when it is written."""

    utterance_id: int
    index: int
    pcm: bytes
    last_in_utterance: bool
    frames: int
    # Characters of the utterance's text the model had read when it made the audio of
    # its last frame (the engine's AudioPacket.text_chars; the proto's AudioFrame).
    text_chars: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Timings:
    ttfa_ms: float
    queue_ms: float
    prefill_ms: float
    first_packet_ms: float
    text_chars: int


@dataclass(frozen=True, slots=True)
class FirstAudio:
    """The utterance's first frame is next."""

    utterance_id: int
    next_seq: int
    timings: Timings


class EventKind(enum.Enum):
    FLUSHED = "flushed"      # every frame of the flushed text has been sent
    STOPPED = "stopped"      # after STOP; nothing of the stopped utterance follows
    RESET = "reset"          # after RESET
    TRUNCATED = "truncated"  # the utterance reached its frame cap (see the proto)


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    utterance_id: int
    next_seq: int  # seq of the next AudioFrame


Output = SessionStarted | AudioFrame | FirstAudio | Event
