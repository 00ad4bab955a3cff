"""The length guard: the most codec frames an utterance may take, from its text.

A model with random weights (tests, the CPU mesh) rarely samples codec EOS, so without a
bound from the text it speaks until the hard cap (2047 frames, 164 s: a 150-token reply in
the mesh played 157 s of noise). The bound must stay well above what real speech needs,
so a real model is never cut, and follow the text, so a random one stops in proportion.

It counts characters, not text tokens: a token's length depends on the tokenizer (the
random presets' ~500-token BPE splits text into ~2x the tokens of Qwen2's 151k vocab).
Speech per character differs by script and class, measured with espeak-ng at its default
rate (12.5 codec frames per second of audio):
- letters, spaces, punctuation: 16-18 characters a second of English (0.70-0.77
  frames/char; natural read speech is ~15 c/s): bound 2 frames (6.25 c/s, 2.6x slower);
- East Asian wide characters (CJK, kana, Hangul; a syllable each): Mandarin 3.0 c/s in
  espeak-ng (4.2 frames/char; natural speech is 4-5 c/s): bound 8 frames (1.56 c/s);
- digits, read as words ("1234567" took 4.3 s: 7.7 frames/digit, a year ~3): bound 10;
plus a floor (`base`, 24 frames = 1.9 s) for short texts and the pauses around them.
The token-based guard before it (24 + 8 frames per text token) gave a 608-character
English reply 145 s with the presets' tokenizer (its noise then played that long); this
gives 99 s, and a text of digits or CJK no less than real speech needs.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass


@dataclass
class TextLength:
    """Characters of an utterance's text by how long they take to say."""

    plain: int = 0  # letters, spaces, punctuation, symbols
    wide: int = 0  # East Asian wide / fullwidth (a syllable each)
    digits: int = 0

    def add(self, text: str) -> None:
        for ch in text:
            if ch.isdigit():
                self.digits += 1
            elif ord(ch) >= 0x1100 and unicodedata.east_asian_width(ch) in ("W", "F"):
                self.wide += 1
            else:
                self.plain += 1


def max_frames_for(length: TextLength, base: int, per_char: float, per_wide_char: float,
                   per_digit: float) -> int:
    """The guard for a text of `length`: base + frames per character of each class."""
    return base + int(per_char * length.plain + per_wide_char * length.wide
                      + per_digit * length.digits)
