"""The session's bounds on a Realtime client's items (conversation/items.py keeps them,
checks a client's, and makes the thinker's context of them)."""

from __future__ import annotations

# What one session holds (a client's items and the replies' own; documented in the README):
# items over either bound are refused with `conversation_too_large`, and the agent's own
# replies make room by deleting the oldest items (conversation.item.deleted).
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 100_000  # one item's text: its parts, a call's arguments or output
MAX_CONVERSATION_CHARS = 1_000_000  # all items' text together (~4 MB at most)


def bounds() -> tuple[int, int, int]:
    return MAX_ITEMS, MAX_ITEM_CHARS, MAX_CONVERSATION_CHARS
