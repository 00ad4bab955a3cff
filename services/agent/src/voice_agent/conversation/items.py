"""A conversation's items, as a door that owns them keeps them (`Items`): messages (the
user's, the replies', a system note), function calls and their outputs, in the OpenAI
item shape (`type`, `role`, `content` parts with `text` or `transcript`); a client's
checked (`client_item`); bounded by the door's limits; and as the thinker reads them
(`chat_ctx`: the agent's chat context is made from these). What a reply's message said
beyond what a client sees (its text as made, its audio's length, the words heard when a
turn cut it) is kept beside it (`Said`), not in it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import llm

from .mic import MicFramer
from .options import ConversationError, invalid

SPEECH_CHARS_PER_S = 14.0  # a reply's pace when nothing says how much of it was heard

Item = dict[str, Any]
# (items, one item's characters, all items' characters) at most, read when checked
Bounds = Callable[[], tuple[int, int, int]]
Decode = Callable[[Any, str], np.ndarray]  # (audio as a door's client sends it, param)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Said:
    """A reply's message as the conversation knows it: its text as made (its transcript
    is what was heard), its audio's length (None: a text reply), and the words heard
    when a turn cut it (the session's record)."""
    text: str = ""
    audio_ms: float | None = None
    heard: str | None = None


class Items:
    """The items, in order (see the module). `on_deleted(item_id)`: one made room for."""

    def __init__(self, bounds: Bounds, on_deleted: Callable[[str], None]) -> None:
        self.all: list[Item] = []
        self.said: dict[str, Said] = {}  # by a reply's message id
        self._bounds = bounds
        self._on_deleted = on_deleted

    def __iter__(self) -> Any:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def add(self, item: Item, previous: Any) -> str | None:
        """A client's item, checked (`check_room`), after `previous` (see `insert`)."""
        self.check_room(item)
        return self.insert(item, previous)

    def append(self, item: Item) -> str | None:
        """The item at the end; returns the id of the one before it."""
        return self.insert(item, None)

    def insert(self, item: Item, previous: Any) -> str | None:
        """The item after `previous` (None: at the end; "root": first); returns the id of
        the one before it."""
        at = (len(self.all) if previous is None else 0 if previous == "root"
              else self._index(previous) + 1)
        self.all.insert(at, item)
        return self.all[at - 1]["id"] if at > 0 else None

    def find(self, item_id: Any) -> Item:
        return self.all[self._index(item_id)]

    def _index(self, item_id: Any) -> int:
        for i, it in enumerate(self.all):
            if it["id"] == item_id:
                return i
        raise ConversationError("item_not_found", f"no item {str(item_id)[:80]!r} in the "
                                "conversation", "item_id")

    def delete(self, item_id: Any) -> None:
        del self.all[self._index(item_id)]
        self.said.pop(item_id, None)

    def _chars(self, item: Item) -> int:
        said = self.said.get(item["id"])
        return item_chars(item, said.text if said is not None else "")

    def check_room(self, item: Item) -> None:
        """A client's item is new and fits the bounds, or it is refused and nothing
        changes."""
        if any(it["id"] == item["id"] for it in self.all):
            raise ConversationError("duplicate_item_id", f"item {item['id']!r} already "
                                    "exists", "item.id")
        max_items, max_item, max_all = self._bounds()
        chars = item_chars(item)
        if chars > max_item:
            raise ConversationError("invalid_value", f"the item holds {chars:,} characters "
                                    f"of text; an item takes at most {max_item:,}", "item")
        held = sum(map(self._chars, self.all))
        if len(self.all) >= max_items or held + chars > max_all:
            raise ConversationError(
                "conversation_too_large", f"the conversation holds {len(self.all)} items "
                f"and {held:,} characters (at most {max_items} and {max_all:,}): delete "
                "items with conversation.item.delete first", "item")

    def make_room(self) -> None:
        """After a reply: the oldest items go while the conversation holds more than its
        bounds, so a long call stays bounded."""
        max_items, _, max_all = self._bounds()
        held = sum(map(self._chars, self.all))
        while len(self.all) > 1 and (len(self.all) > max_items or held > max_all):
            held -= self._chars(self.all[0])
            old = self.all.pop(0)
            self.said.pop(old["id"], None)
            self._on_deleted(old["id"])

    def chat_ctx(self, instructions: str | None, greeting: bool = False) -> llm.ChatContext:
        """The items as the thinker reads them, `instructions` first. `greeting`: a reply
        asked for before anyone spoke gets its instructions as the first turn too (the
        thinker answers a conversation)."""
        ctx = llm.ChatContext.empty()
        if instructions:
            ctx.add_message(role="system", content=instructions)
        names = {it["call_id"]: it["name"] for it in self.all if it["type"] == "function_call"}
        for it in self.all:
            if it["type"] == "function_call":
                ctx.items.append(llm.FunctionCall(id=it["id"], call_id=it["call_id"],
                                                  name=it["name"], arguments=it["arguments"]))
            elif it["type"] == "function_call_output":
                ctx.items.append(llm.FunctionCallOutput(
                    id=it["id"], call_id=it["call_id"], name=names.get(it["call_id"], ""),
                    output=it["output"], is_error=False))
            else:
                said = " ".join(p.get("text") or p.get("transcript") or ""
                                for p in it["content"]).strip()
                if said:
                    ctx.add_message(role=it["role"], content=said, id=it["id"])
        if greeting and instructions and not any(getattr(i, "role", "system") != "system"
                                                 for i in ctx.items):
            ctx.add_message(role="user", content=instructions)
        return ctx


def client_item(raw: Any, decode: Decode, input_rate: int,
                held: Items) -> tuple[Item, list[rtc.AudioFrame] | None]:
    """A client's item, checked, and its audio to transcribe (an input_audio part without
    a transcript). `decode`: the door's audio (base64, its format) as int16 samples at
    `input_rate`; `held`: the conversation's items (a call's output answers one)."""
    if not isinstance(raw, dict):
        raise invalid("item must be an object", "item")
    kind = raw.get("type", "message")
    base = {"id": raw.get("id") if isinstance(raw.get("id"), str) else new_id("item"),
            "status": "completed"}
    if kind == "function_call_output":
        call_id, output = raw.get("call_id"), raw.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            raise invalid("a function_call_output needs call_id and output (strings)", "item")
        if not any(it.get("call_id") == call_id and it["type"] == "function_call"
                   for it in held):
            raise invalid(f"no function_call with call_id {call_id[:80]!r} in the "
                          "conversation", "item.call_id")
        return {**base, "type": kind, "call_id": call_id, "output": output}, None
    if kind == "function_call":
        fields = [raw.get(k) for k in ("call_id", "name", "arguments")]
        if not all(isinstance(v, str) for v in fields):
            raise invalid("a function_call needs call_id, name and arguments (strings)", "item")
        return {**base, "type": kind, "call_id": fields[0], "name": fields[1],
                "arguments": fields[2]}, None
    if kind != "message":
        raise invalid("item.type must be message, function_call or function_call_output, "
                      f"not {str(kind)[:40]!r}", "item.type")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise invalid("item.role must be user, assistant or system", "item.role")
    content: list[dict[str, Any]] = []
    audio: list[rtc.AudioFrame] | None = None
    parts = raw.get("content")
    if not isinstance(parts, list) or not parts:
        raise invalid("item.content must be a non-empty list", "item.content")
    for i, p in enumerate(parts):
        t = p.get("type") if isinstance(p, dict) else None
        if t in ("input_text", "text", "output_text") and isinstance(p.get("text"), str):
            content.append({"type": t, "text": p["text"]})
        elif t == "input_audio" and role == "user" and audio is None:
            pcm = decode(p.get("audio"), f"item.content[{i}].audio")
            clip = MicFramer(input_rate)  # a clip, not the mic's clock
            audio = clip.push(pcm.tobytes()) + clip.flush()
            content.append({"type": "input_audio", "transcript": p.get("transcript")})
        else:
            raise invalid(f"item.content[{i}]: a {role} message takes input_text / text "
                          "parts (and one input_audio for a user)", f"item.content[{i}]")
    return ({**base, "type": "message", "role": role, "content": content},
            audio if audio is not None and not content[0].get("transcript") else None)


def item_chars(item: Item, made: str = "") -> int:
    """The text an item holds: its parts' text and transcripts, a call's arguments and
    output (what the thinker is sent, and what the conversation keeps); `made`: a reply's
    text as made (`Said.text`), which its transcript repeats."""
    n = sum(len(p.get("text") or p.get("transcript") or "") for p in item.get("content", ()))
    return max(n, len(made)) + len(item.get("arguments", "")) + len(item.get("output", ""))


def heard_text(text: str, heard_ms: float, audio_ms: float, all_audio: bool,
               read: int | None = None) -> str:
    """The part of a reply's `text` that `heard_ms` of its audio spoke, to the last whole
    word: `read`, the characters the TTS had read by then, when known; else by the reply's
    characters per second of audio once it is all made, by SPEECH_CHARS_PER_S before."""
    if heard_ms >= audio_ms and all_audio:
        return text
    if read is not None:
        chars = float(read)
    elif all_audio and audio_ms > 0:
        chars = len(text) * heard_ms / audio_ms
    else:
        chars = heard_ms / 1000 * SPEECH_CHARS_PER_S
    n = min(len(text), int(chars))
    if n < len(text) and not text[n].isspace():
        n = text.rfind(" ", 0, n) + 1  # back to the word's start: only whole words heard
    return text[:n].rstrip()
