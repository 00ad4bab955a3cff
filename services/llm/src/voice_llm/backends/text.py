"""Token ids to streamed text: incremental detokenizing and stop strings.

What vLLM's output processor does for its engine, for backends that have none (the
Transformers one). Both are pure and step-wise, so they are tested without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IncrementalDetokenizer:
    """Emits only whole characters, decoding a small window rather than the whole reply.

    Byte-level BPE tokens can end inside a UTF-8 character; the text is held back while
    it ends in U+FFFD (TGI's `decode_token` offsets scheme).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded for context
        self._read = 0  # end of what has been emitted

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """What is still held back (an incomplete character shows as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True) if ids else ""


class StopMatcher:
    """Cuts the stream at the first stop string; the stop string itself is never sent.

    Text that could be the start of a stop string is held back until the next piece
    decides it, so no client ever sees half of a stop string.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.matched = False

    def feed(self, text: str) -> str:
        """Returns the text that is safe to send; sets `matched` at a stop string."""
        if self.matched:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.matched = True
            self._held = ""
            return buf[: min(hits)]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.matched else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
