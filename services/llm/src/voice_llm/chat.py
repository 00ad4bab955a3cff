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
class ChatMessage:
    role: Role
    parts: tuple[Part, ...]

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

    @property
    def has_audio(self) -> bool:
        return any(m.audio for m in self.messages)


class FinishReason(enum.Enum):
    STOP = "stop"  # end of turn or a stop string
    LENGTH = "length"  # max_tokens reached


@dataclass
class Chunk:
    """What a backend yields: the next text, and on the last chunk why it ended.

    `new_tokens` counts the tokens this chunk's text came from (text may be empty while
    a multi-byte character or a possible stop string is held back).
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    finish: FinishReason | None = None
