"""Utterance audio handed from the STT to the LLM plugin ("audio" STT mode).

In that mode the STT does not ask the thinker for a transcript: it keeps the utterance
here and returns a marker, `[utterance <id>, N.N s]`, at once; the LLM plugin swaps each
marker in the chat context for the audio itself, so an omni thinker answers the speech
directly (seed: "音频输入直送 Omni", one thinker round trip less per turn). The chat
context then holds markers, not words. Bounded: the oldest utterances are forgotten
(their marker stays as plain text).
"""

from __future__ import annotations

import itertools
import re
from collections import OrderedDict

_MARKER = re.compile(r"^\[utterance (\d+), \d+(?:\.\d+)? s\]$")


class UtteranceStore:
    def __init__(self, capacity: int = 32) -> None:
        self._audio: OrderedDict[int, bytes] = OrderedDict()
        self._ids = itertools.count(1)
        self._capacity = capacity

    def put(self, pcm16k: bytes) -> str:
        """Keep one utterance (s16le mono 16 kHz); returns its marker text."""
        uid = next(self._ids)
        self._audio[uid] = pcm16k
        while len(self._audio) > self._capacity:
            self._audio.popitem(last=False)
        return f"[utterance {uid}, {len(pcm16k) / 32000:.1f} s]"

    def get(self, text: str) -> bytes | None:
        """The audio a marker stands for (None: not a marker, or forgotten)."""
        m = _MARKER.match(text.strip())
        return self._audio.get(int(m.group(1))) if m else None
