"""A Realtime session's conversation items (`Items`): the client's (created, deleted,
truncated, retrieved by its events) and the replies' own, as the API shapes them, bounded,
and as the thinker reads them (`chat_ctx`: the agent's chat context is made from these).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import llm

from ..conversation.mic import MicFramer
from .events import RealtimeError, new_id

# What one session holds (a client's items and the replies' own; documented in the README):
# items over either bound are refused with `conversation_too_large`, and the agent's own
# replies make room by deleting the oldest items (conversation.item.deleted).
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 100_000  # one item's text: its parts, a call's arguments or output
MAX_CONVERSATION_CHARS = 1_000_000  # all items' text together (~4 MB at most)
SPEECH_CHARS_PER_S = 14.0  # a reply's pace when nothing says how much of it was heard

Emit = Callable[..., None]
Decode = Callable[[Any, str], np.ndarray]


class Items:
    """The items, in order (see the module). `emit` sends a server event; `as_json` is
    an item as the client sees it (the dialect's part names, no private keys)."""

    def __init__(self, emit: Emit, as_json: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.all: list[dict[str, Any]] = []
        self._emit = emit
        self._json = as_json

    def __iter__(self) -> Any:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def append(self, item: dict[str, Any], announce: bool = True) -> str | None:
        """The item at the end; returns the id of the one before it."""
        prev = self.all[-1]["id"] if self.all else None
        self.all.append(item)
        if announce:
            self._emit("conversation.item.added", previous_item_id=prev, item=self._json(item))
        return prev

    def find(self, item_id: Any) -> dict[str, Any]:
        return self.all[self._index(item_id)]

    def _index(self, item_id: Any) -> int:
        for i, it in enumerate(self.all):
            if it["id"] == item_id:
                return i
        raise RealtimeError("item_not_found", f"no item {str(item_id)[:80]!r} in the "
                            "conversation", "item_id")

    def delete(self, item_id: Any) -> None:
        del self.all[self._index(item_id)]
        self._emit("conversation.item.deleted", item_id=item_id)

    def create(self, raw: Any, previous: Any, decode: Decode, input_rate: int) -> dict[str, Any]:
        """A client's item (conversation.item.create), placed after `previous` (None: at
        the end; "root": first); announced (conversation.item.added)."""
        item = self._new(raw, decode, input_rate)
        if previous is None:
            at = len(self.all)
        elif previous == "root":
            at = 0
        else:
            at = self._index(previous) + 1
        if any(it["id"] == item["id"] for it in self.all):
            raise RealtimeError("duplicate_item_id", f"item {item['id']!r} already exists",
                                "item.id")
        self._check_room(item)
        self.all.insert(at, item)
        prev_id = self.all[at - 1]["id"] if at > 0 else None
        self._emit("conversation.item.added", previous_item_id=prev_id, item=self._json(item))
        return item

    def _check_room(self, item: dict[str, Any]) -> None:
        """A client's item fits the session's bounds (MAX_ITEM_CHARS, MAX_ITEMS,
        MAX_CONVERSATION_CHARS), or it is refused and nothing changes."""
        chars = item_chars(item)
        if chars > MAX_ITEM_CHARS:
            raise RealtimeError("invalid_value", f"the item holds {chars:,} characters of "
                                f"text; an item takes at most {MAX_ITEM_CHARS:,}", "item")
        held = sum(map(item_chars, self.all))
        if len(self.all) >= MAX_ITEMS or held + chars > MAX_CONVERSATION_CHARS:
            raise RealtimeError("conversation_too_large", f"the conversation holds "
                                f"{len(self.all)} items and {held:,} characters (at most "
                                f"{MAX_ITEMS} and {MAX_CONVERSATION_CHARS:,}): delete items "
                                "with conversation.item.delete first", "item")

    def make_room(self) -> None:
        """After a reply: the oldest items go (conversation.item.deleted) while the
        session holds more than its bounds, so a long call stays bounded."""
        held = sum(map(item_chars, self.all))
        while len(self.all) > 1 and (len(self.all) > MAX_ITEMS
                                     or held > MAX_CONVERSATION_CHARS):
            old = self.all.pop(0)
            held -= item_chars(old)
            self._emit("conversation.item.deleted", item_id=old["id"])

    def _new(self, raw: Any, decode: Decode, input_rate: int) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise RealtimeError("invalid_value", "item must be an object", "item")
        kind = raw.get("type", "message")
        item_id = raw.get("id") if isinstance(raw.get("id"), str) else new_id("item")
        base = {"id": item_id, "object": "realtime.item", "status": "completed"}
        if kind == "function_call_output":
            call_id, output = raw.get("call_id"), raw.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise RealtimeError("invalid_value", "a function_call_output needs call_id "
                                    "and output (strings)", "item")
            if not any(it.get("call_id") == call_id and it["type"] == "function_call"
                       for it in self.all):
                raise RealtimeError("invalid_value", f"no function_call with call_id "
                                    f"{call_id[:80]!r} in the conversation", "item.call_id")
            return {**base, "type": kind, "call_id": call_id, "output": output}
        if kind == "function_call":
            fields = [raw.get(k) for k in ("call_id", "name", "arguments")]
            if not all(isinstance(v, str) for v in fields):
                raise RealtimeError("invalid_value", "a function_call needs call_id, name and "
                                    "arguments (strings)", "item")
            return {**base, "type": kind, "call_id": fields[0], "name": fields[1],
                    "arguments": fields[2]}
        if kind != "message":
            raise RealtimeError("invalid_value", "item.type must be message, function_call "
                                f"or function_call_output, not {str(kind)[:40]!r}", "item.type")
        role = raw.get("role")
        if role not in ("user", "assistant", "system"):
            raise RealtimeError("invalid_value", "item.role must be user, assistant or system",
                                "item.role")
        content: list[dict[str, Any]] = []
        audio: list[rtc.AudioFrame] | None = None
        parts = raw.get("content")
        if not isinstance(parts, list) or not parts:
            raise RealtimeError("invalid_value", "item.content must be a non-empty list",
                                "item.content")
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
                raise RealtimeError("invalid_value", f"item.content[{i}]: a {role} message "
                                    "takes input_text / text parts (and one input_audio for "
                                    "a user)", f"item.content[{i}]")
        item = {**base, "type": "message", "role": role, "content": content}
        if audio is not None and not content[0].get("transcript"):
            item["_audio"] = audio
        return item

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
                text = " ".join(p.get("text") or p.get("transcript") or ""
                                for p in it["content"]).strip()
                if text:
                    ctx.add_message(role=it["role"], content=text, id=it["id"])
        if greeting and instructions and not any(getattr(i, "role", "system") != "system"
                                                 for i in ctx.items):
            ctx.add_message(role="user", content=instructions)
        return ctx


def item_chars(item: dict[str, Any]) -> int:
    """The text an item holds: its parts' text and transcripts, a call's arguments and
    output (what the thinker is sent, and what the session keeps)."""
    n = sum(len(p.get("text") or p.get("transcript") or "") for p in item.get("content", ()))
    # a reply's message: its text as made (`_text`), which its transcript repeats
    return max(n, len(item.get("_text", ""))) + len(item.get("arguments", "")) \
        + len(item.get("output", ""))


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


def wire_json(ev: dict[str, Any]) -> str:
    """An event as a text frame. A client's JSON may escape a lone surrogate ("\\ud800"),
    and an error that quotes it then holds one: UTF-8 cannot carry it, and sending it
    raised in the sender and ended the session. Such an event goes escaped (ASCII)."""
    text = json.dumps(ev, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(ev)
    return text
