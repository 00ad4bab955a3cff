"""What counts as a backchannel: short listener talk ("yeah", "okay", "mm-hmm") that
says "go on" rather than "my turn".

The duplex controller pauses the reply when the user starts speaking over it, and asks
this policy what the speech was: longer than `max_speech_s`, or any word outside the
vocabulary, is an interruption; only vocabulary words (or no words at all: a cough, a
noise the VAD took for speech) mean the reply resumes where it paused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Words a listener says while the other one talks. Recognisers spell them many ways
# ("uh-huh", "Uh, hu", "mhm", "Um."); split on anything not a letter, then look up.
DEFAULT_WORDS = (
    "uh huh hu u mm mmm hmm hm mhm mmhm um uhm ah oh yeah yep yes yup ok okay right sure "
    "alright i see got it cool nice wow true exactly indeed"
)

_WORD = re.compile(r"[a-z']+")


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("'", ""))


@dataclass(frozen=True)
class BackchannelPolicy:
    words: frozenset[str]
    max_speech_s: float = 1.5  # talk longer than this over the reply takes the turn
    wait_s: float = 0.6  # after the user falls silent, how long words may take to come
    max_words: int = 4  # "yeah okay I see" is a backchannel; five words are a turn

    @classmethod
    def parse(cls, words: str, *, max_speech_s: float, wait_s: float) -> BackchannelPolicy:
        return cls(frozenset(words_of(words)), max_speech_s=max_speech_s, wait_s=wait_s)

    def is_backchannel(self, text: str) -> bool:
        """True for listener talk; False for anything that asks for the turn. An empty
        transcript is a backchannel (nothing was said)."""
        ws = words_of(text)
        return len(ws) <= self.max_words and all(w in self.words for w in ws)
