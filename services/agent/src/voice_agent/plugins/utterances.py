"""Utterance audio handed from the STT to the LLM plugin ("audio" STT mode).

In that mode the STT does not ask the thinker for a transcript: it keeps the utterance
here and returns a marker, `[utterance <id>, N.N s]`, at once; the LLM plugin swaps each
marker in the chat context for the audio itself, so an omni thinker answers the speech
directly (seed: "音频输入直送 Omni", one thinker round trip less per turn). The chat
context then holds markers, not words. Bounded: the oldest utterances are forgotten
(their marker stays as plain text).

The words come off the critical path: the STT has the offline ear transcribe each
utterance in the background (`heard`). The page's transcript waits for them
(`wait_words`), and a reply request sends an earlier turn as its words once known, only
the newest as audio: re-encoding every past turn's audio made each request's prompt grow
with the call (p50 405 tokens against 223 for text, bench/results/2026-11-29-conv128-gpu).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import OrderedDict

_MARKER = re.compile(r"^\[utterance (\d+), \d+(?:\.\d+)? s\]$")
_ANY_MARKER = re.compile(r"\[utterance \d+, \d+(?:\.\d+)? s\]")


class UtteranceStore:
    def __init__(self, capacity: int = 32) -> None:
        self._audio: OrderedDict[int, bytes] = OrderedDict()
        self._heard: dict[int, asyncio.Event] = {}  # set when the ear has said (or not)
        self._words: dict[int, str | None] = {}
        self._ids = itertools.count(1)
        self._capacity = capacity

    def put(self, pcm16k: bytes) -> str:
        """Keep one utterance (s16le mono 16 kHz); returns its marker text."""
        uid = next(self._ids)
        self._audio[uid] = pcm16k
        self._heard[uid] = asyncio.Event()
        while len(self._audio) > self._capacity:
            old, _ = self._audio.popitem(last=False)
            self._heard.pop(old).set()  # forgotten: nobody waits for it
            self._words.pop(old, None)
        return f"[utterance {uid}, {len(pcm16k) / 32000:.1f} s]"

    def get(self, text: str) -> bytes | None:
        """The audio a marker stands for (None: not a marker, or forgotten)."""
        uid = _uid(text)
        return self._audio.get(uid) if uid is not None else None

    def heard(self, marker: str, words: str | None) -> None:
        """The ear's words for an utterance (None: it could not say)."""
        uid = _uid(marker) or 0
        if uid in self._heard:
            self._words[uid] = words
            self._heard[uid].set()

    def words(self, text: str) -> str | None:
        """A marker's words, if the ear has said them."""
        return self._words.get(_uid(text) or 0)

    async def wait_words(self, text: str, timeout_s: float = 10.0) -> str:
        """What to show for a user message: a marker's words once the ear has said them
        (the marker if it cannot, or not within `timeout_s`); any other text as it is."""
        uid = _uid(text) or 0
        heard = self._heard.get(uid)
        if heard is None:
            return text
        try:
            await asyncio.wait_for(heard.wait(), timeout_s)
        except TimeoutError:
            return text
        return self._words.get(uid) or text


    async def spoken(self, text: str, timeout_s: float) -> str:
        """`text` (a turn's transcript: one marker per utterance) with each marker as its
        words, waiting `timeout_s` for them in all; one not in by then stays a marker."""
        deadline = time.monotonic() + timeout_s
        for marker in _ANY_MARKER.findall(text):
            words = await self.wait_words(marker, max(0.0, deadline - time.monotonic()))
            text = text.replace(marker, words, 1)
        return text


def _uid(text: str) -> int | None:
    m = _MARKER.match(text.strip())
    return int(m.group(1)) if m else None
