"""The bridge between LLM text and the TTS stream: when to send which text.

Seed 001's rules, made exact:
- Punctuation flushes at once (seed: "标点立即 flush"), as long as the segment holds
  `starter_min` characters (no 1-character segments).
- The **starter**: the reply's first `starter_max` characters go out as they come, each
  piece at once (where sentences are FLUSHed, a trailing ".", "!" or "?" waits for what
  follows). Our TTS engine reads a stream: it commits a text token only once it is
  stable (a word followed by a space or punctuation) and starts speaking at the first
  (voice_tts/engine/text.py, scheduler.py), and each talker step waits for its next
  token, so a half word sent early is never spoken early. Waiting here for a word's end
  as well cost one more LLM token before the first audio ("I can " went out with
  " help"; now "I" is spoken once " can" arrives). 6 chars by default.
- Every later segment: at punctuation, else at the last word boundary in
  [min_chars, max_chars] once it reaches `max_chars` (8–12 by default).
- `finish()` sends whatever is left (the end of the reply).

Segments are exact slices of the LLM stream: concatenated they give the input back,
whitespace included, because the TTS server concatenates pieces itself. A "character"
is a Unicode code point (one Chinese character counts 1). A boundary is the end of a
whitespace run or the gap between two CJK characters. ASCII `.,!?;:` count as
punctuation only when followed by whitespace ("3.14" and "e.g" stay whole), so at the
end of the buffer they wait for the next piece; CJK punctuation cuts at once.

This module knows nothing about gRPC or LiveKit; the TTS plugin feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Punctuation that ends a clause on its own (CJK, fullwidth, ellipsis, newline).
_CJK_PUNCT = frozenset("。！？；，、：…\n")
# ASCII punctuation: a boundary only when whitespace follows.
_ASCII_PUNCT = frozenset(".,!?;:")
# The punctuation that ends a sentence (for the optional FLUSH per sentence).
_SENTENCE_END = frozenset("。！？.!?…\n")
_ASCII_STOPS = "".join(_SENTENCE_END & _ASCII_PUNCT)  # ".!?": whitespace shows they ended


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x3040 <= cp <= 0x30FF  # kana
        or 0x3400 <= cp <= 0x4DBF
        or 0x4E00 <= cp <= 0x9FFF
        or 0xAC00 <= cp <= 0xD7AF  # hangul
        or 0xF900 <= cp <= 0xFAFF
    )


@dataclass(frozen=True)
class BridgeConfig:
    starter_min_chars: int = 2
    starter_max_chars: int = 6
    min_chars: int = 8
    max_chars: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.starter_min_chars <= self.starter_max_chars:
            raise ValueError("bridge: need 1 <= starter_min_chars <= starter_max_chars")
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError("bridge: need 1 <= min_chars <= max_chars")


@dataclass
class Segment:
    text: str
    reason: str  # "starter" | "punct" | "length" | "final"
    ends_sentence: bool


@dataclass
class TextSegmenter:
    """Cuts a stream of LLM text pieces into TTS segments (see the module docstring)."""

    config: BridgeConfig = field(default_factory=BridgeConfig)
    # the TTS is FLUSHed at each sentence's end (an in-context clone, plugins/tts.py): a
    # starter's ".", "!" or "?" then waits for what follows, which shows it ended one
    flushes: bool = False
    _buf: str = ""
    _sent: int = 0  # characters sent so far
    stats: dict[str, int] = field(default_factory=dict)

    def push(self, piece: str) -> list[Segment]:
        self._buf += piece
        out: list[Segment] = []
        while (seg := self._next()) is not None:
            out.append(seg)
        return out

    def finish(self) -> list[Segment]:
        """End of the reply: the rest of the buffer, if any."""
        if not self._buf:
            return []
        text, self._buf = self._buf, ""
        return [self._emit(text, "final")]

    @property
    def pending(self) -> str:
        return self._buf

    def _next(self) -> Segment | None:
        buf = self._buf
        starting = self._sent < self.config.starter_max_chars
        lo, hi = self.config.min_chars, self.config.max_chars
        # 1) punctuation, once the segment holds starter_min characters (any, while the
        # starter streams: its pieces are as short as they come).
        for i, ch in enumerate(buf):
            end = i + 1
            ascii_stop = ch in _ASCII_PUNCT and end < len(buf) and buf[end].isspace()
            if ch not in _CJK_PUNCT and not ascii_stop:
                continue
            if end < self.config.starter_min_chars and not starting:
                continue
            # keep the whitespace after the punctuation with this segment
            while end < len(buf) and buf[end].isspace() and buf[end] != "\n":
                end += 1
            reason = "starter" if starting else "punct"
            return self._cut(end, reason, ch in _SENTENCE_END)
        if starting:
            end = len(buf.rstrip(_ASCII_STOPS)) if self.flushes else len(buf)
            return self._cut(end, "starter", False) if end else None
        # 2) long enough: the last boundary in [lo, hi] (else in [starter_min, lo), a
        # shorter segment beats a cut word); a single word longer than 2*hi is cut at hi.
        if len(buf) < hi:
            return None
        floor = self.config.starter_min_chars
        for end in [*range(hi, lo - 1, -1), *range(lo - 1, floor - 1, -1)]:
            if self._is_boundary(buf, end):
                return self._cut(end, "length", False)
        if len(buf) < 2 * hi:
            return None
        return self._cut(hi, "length", False)

    @staticmethod
    def _is_boundary(buf: str, end: int) -> bool:
        if end > len(buf) or end < 1:
            return False
        prev = buf[end - 1]
        if end == len(buf):
            return prev.isspace()  # a CJK char at the end may still get its punctuation
        nxt = buf[end]
        if prev.isspace() and not nxt.isspace():
            return True
        return _is_cjk(prev) and _is_cjk(nxt)

    def _cut(self, end: int, reason: str, ends_sentence: bool) -> Segment:
        text, self._buf = self._buf[:end], self._buf[end:]
        return self._emit(text, reason, ends_sentence)

    def _emit(self, text: str, reason: str, ends_sentence: bool = True) -> Segment:
        self._sent += len(text)
        self.stats[reason] = self.stats.get(reason, 0) + 1
        return Segment(text=text, reason=reason, ends_sentence=ends_sentence)
