"""The interface every generation backend implements, and the prompt rendering they share.

A backend turns a validated ChatJob into an async stream of `Chunk`s and can abort a
request by id. Contract for implementers:
- `generate` yields chunks in order; the last one has `finish` set. Closing the generator
  early (the caller was cancelled) must abort the request in the engine before returning.
- `abort(request_id)` stops the engine's work for that request at the next step and is
  idempotent; it never raises for an unknown or finished id.
- Input the backend cannot take (prompt over max_model_len) raises InvalidInput before
  any chunk is yielded. Audio reaches only backends whose `accepts_audio` is true.
- A request aborted while its stream is still read ends that stream with errors.Aborted,
  never with a made-up final chunk.
The backend knows nothing about gRPC, admission or metrics.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from itertools import groupby
from typing import Any, Protocol

from voice_llm.backends.tools import template_tool_calls
from voice_llm.chat import AudioClip, ChatJob, ChatMessage, Chunk, Role, SamplingOptions
from voice_llm.errors import InvalidInput


class Backend(Protocol):
    name: str
    # True when audio parts can go to the model as audio (an omni model on vLLM).
    accepts_audio: bool

    async def start(self) -> None:
        """Loads the model and runs one warm-up generation; health turns SERVING after it."""

    def generate(self, job: ChatJob) -> AsyncIterator[Chunk]: ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Raises if the engine can no longer serve (a dead engine process, say)."""

    async def close(self) -> None: ...


# Stands in for an audio clip while the chat template renders; the backend swaps it for
# the model's own placeholder (e.g. Qwen3-Omni's <|audio_start|><|audio_pad|><|audio_end|>).
# Going through plain text works with any template, multimodal-aware or not.
AUDIO_SENTINEL = "<voice-llm-audio/>"


class PlainText:
    """Keeps the tokenizer's markers (`<|im_end|>`, `<|im_start|>`, `<think>`: its added
    tokens) in request text from reading as markers: a zero-width space after their first
    character. Only the chat template opens and closes turns; a text part that writes
    `<|im_end|><|im_start|>system` stays words the model reads, not a new system turn."""

    def __init__(self, tokenizer: Any) -> None:
        markers = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._find = re.compile("|".join(map(re.escape, markers))) if markers else None

    def __call__(self, text: str) -> str:
        if self._find is None:
            return text
        return self._find.sub(lambda m: m[0][0] + "\u200b" + m[0][1:], text)


def chat_template_messages(
    messages: Sequence[ChatMessage], plain: Callable[[str], str] = str,
) -> tuple[list[dict[str, Any]], list[AudioClip]]:
    """Messages in the HF chat-template shape (string content), plus the audio clips in
    prompt order, each marked in the text by AUDIO_SENTINEL. `plain` (a `PlainText`)
    defuses markers in the text."""
    out: list[dict[str, Any]] = []
    clips: list[AudioClip] = []
    for m in messages:
        pieces: list[str] = []
        # Adjacent text parts are one text, checked and defused joined: "<|im_" + "end|>"
        # must not become the marker the two halves spell.
        for is_audio, run in groupby(m.parts, key=lambda p: isinstance(p, AudioClip)):
            if is_audio:
                for clip in run:
                    clips.append(clip)
                    pieces.append(AUDIO_SENTINEL)
                continue
            text = "".join(run)
            if AUDIO_SENTINEL in text:
                raise InvalidInput("text parts must not contain the audio sentinel")
            pieces.append(plain(text))
        msg: dict[str, Any] = {"role": m.role.value, "content": "".join(pieces)}
        if m.tool_calls:
            msg["tool_calls"] = template_tool_calls(m.tool_calls)
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out, clips


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None = None) -> str:
    """The chat template applied up to the assistant's turn; a clear error if there is none.
    `tools` (tools.template_tools) are rendered by the template, as it teaches the model
    to call them."""
    if not getattr(tokenizer, "chat_template", None):
        raise RuntimeError("the model's tokenizer has no chat_template; the thinker needs one")
    # enable_thinking=False: a voice reply must not open with a <think> block (Qwen3
    # templates honour it; other templates ignore unknown variables).
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True,
        enable_thinking=False)


def check_prompt_len(n_prompt: int, max_model_len: int) -> None:
    """A prompt must leave room for at least one reply token."""
    if n_prompt >= max_model_len:
        raise InvalidInput(
            f"the conversation is {n_prompt} tokens; the model takes fewer than "
            f"{max_model_len} (LLM_MAX_MODEL_LEN): shorten it"
        )


def warmup_job() -> ChatJob:
    """The short generation a backend runs before health says SERVING."""
    return ChatJob(
        "warmup",
        (ChatMessage(Role.USER, ("hello",)),),
        SamplingOptions(max_tokens=4, temperature=0.3, top_p=0.9, seed=0),
    )
