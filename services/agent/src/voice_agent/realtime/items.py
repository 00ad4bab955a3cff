"""A Realtime client's items: the session's bounds on them, and an item a client creates
(`conversation.item.create`), checked, in the conversation's item shape
(conversation/items.py keeps them and makes the thinker's context of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from livekit import rtc

from ..conversation.items import Item, Items, new_id
from ..conversation.mic import MicFramer
from ..conversation.options import invalid

# What one session holds (a client's items and the replies' own; documented in the README):
# items over either bound are refused with `conversation_too_large`, and the agent's own
# replies make room by deleting the oldest items (conversation.item.deleted).
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 100_000  # one item's text: its parts, a call's arguments or output
MAX_CONVERSATION_CHARS = 1_000_000  # all items' text together (~4 MB at most)


def bounds() -> tuple[int, int, int]:
    return MAX_ITEMS, MAX_ITEM_CHARS, MAX_CONVERSATION_CHARS


def client_item(raw: Any, decode: Callable[[Any, str], np.ndarray], input_rate: int,
                held: Items) -> tuple[Item, list[rtc.AudioFrame] | None]:
    """A client's item, and its audio to transcribe (an input_audio part without a
    transcript); `held`: the conversation's items (a call's output answers one of them)."""
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
