"""The thinker's domain types: a validated chat job in, generation chunks out.

Plain dataclasses shared by the servicer and every backend. They know nothing about gRPC
(protocol.py converts) and nothing about tokenizers (backends render prompts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000  # the only rate the contract accepts


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a tool's result (ChatMessage.tool_call_id names the call)


@dataclass(frozen=True)
class AudioClip:
    """Mono 16 kHz audio, float32 in [-1, 1]."""

    samples: np.ndarray  # (T,) float32

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


# A message part is its text or its audio, in the order the client sent them.
Part = str | AudioClip


@dataclass(frozen=True)
class ToolCall:
    """A call the model made (or, in the conversation, made earlier)."""

    id: str
    name: str
    arguments: str  # a JSON object's text


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is its arguments' JSON Schema."""

    name: str
    description: str
    parameters: dict


class ToolMode(enum.Enum):
    AUTO = "auto"  # text or calls, the model's choice; calls parsed from the text
    NONE = "none"  # no tools shown, nothing parsed
    REQUIRED = "required"  # one call to any tool, constrained to the schemas
    FUNCTION = "function"  # one call to ToolChoice.function, constrained to its schema


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolMode = ToolMode.AUTO
    function: str | None = None  # the tool's name when mode is FUNCTION

    @property
    def constrained(self) -> bool:
        return self.mode in (ToolMode.REQUIRED, ToolMode.FUNCTION)


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    parts: tuple[Part, ...]
    tool_calls: tuple[ToolCall, ...] = ()  # ASSISTANT only
    tool_call_id: str = ""  # TOOL only: the call this is the result of

    @property
    def text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def audio(self) -> tuple[AudioClip, ...]:
        return tuple(p for p in self.parts if isinstance(p, AudioClip))


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int
    temperature: float  # 0 = greedy
    top_p: float
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class ChatJob:
    """One Chat call after validation: what a backend generates from."""

    request_id: str
    messages: tuple[ChatMessage, ...]  # the system prompt, if any, is messages[0]
    options: SamplingOptions
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice()

    @property
    def active_tools(self) -> tuple[ToolSpec, ...]:
        """The tools the model is shown and whose calls are parsed (none for NONE)."""
        return () if self.tool_choice.mode is ToolMode.NONE else self.tools

    @property
    def has_audio(self) -> bool:
        return any(m.audio for m in self.messages)


class FinishReason(enum.Enum):
    STOP = "stop"  # end of turn or a stop string
    LENGTH = "length"  # max_tokens reached
    TOOL_CALLS = "tool_calls"  # ended after calling tools


@dataclass
class Chunk:
    """What a backend yields: the next text, and on the last chunk why it ended.

    `new_tokens` counts the tokens this chunk's text came from (text may be empty while
    a multi-byte character or a possible stop string is held back). `tool_calls` are
    whole calls parsed from the reply, in order, after this chunk's text.
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    finish: FinishReason | None = None
    tool_calls: tuple[ToolCall, ...] = ()
