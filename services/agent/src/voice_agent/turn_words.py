"""A text end-of-turn detector: the transcript's last word says whether the user is done.

A silence-only policy ends the turn after a fixed silence, so a pause inside a sentence
("I want to ... book a table") is taken for its end. The framework asks a turn detector,
once the VAD's silence has ended an utterance and its transcript is in, how likely the
turn is over; below the detector's threshold it waits `max_endpointing_delay_s` instead of
`min_endpointing_delay_s` (and a user who speaks again cancels the wait). LiveKit's text
model does this with a small LLM whose weights are downloaded at run time; this one
needs nothing: an English turn rarely ends on an article, a preposition, a conjunction,
an auxiliary verb, a possessive or a filler ("to", "the", "and", "is", "my", "um"), on a
verb still missing its object ("tell me", "remind us"), or on a comma; a wh-question
may end on a preposition ("Where are you from?"). Measured on
AutoRTC's paused turns (bench/turns.py; services/agent/README.md).

conversation/turn_end.py asks it (alone, or beside the audio model); English only:
other languages get the silence policy.
"""

from __future__ import annotations

import re

# Words an English turn rarely ends on: the speaker has more to say. Words that often
# end one ("in", "on", "that", "so", "do", "can" ...) are left out: a wrong hold costs the
# user up to max_endpointing_delay_s of waiting, a wrong end only the chance to go on.
HOLD_WORDS = frozenset({
    "a", "an", "the", "my", "your", "his", "her", "its", "our", "their", "every",
    "to", "of", "at", "for", "with", "from", "by", "into", "onto", "between", "through",
    "than", "as", "like",
    "and", "but", "or", "nor", "because", "if", "although", "though", "whether",
    "is", "are", "was", "were", "am", "wanna", "gonna", "want",
    "um", "uh", "er", "erm",
})
# A verb that needs its second object, then only the first: "Can you tell me", "Please
# remind me", "Show us" (tell me *what*, remind me *to*): the pause before the rest was
# read as the end of the turn on 31 of 32 such turns (bench/conversations.py, H100).
TWO_OBJECT_VERBS = frozenset({"tell", "remind", "show", "give", "let", "ask", "teach",
                              "send", "bring", "lend", "offer"})
OBJECT_PRONOUNS = frozenset({"me", "us", "him", "her", "them"})
# A question that moved a preposition's object to its front ends on the preposition:
# "Which platform does the train leave from?", "What are you looking at?", "Who did you
# go with?". Held, such a complete question waited 2.7 s every time (11 of 11 on the
# H200 sweep). Its opening word can be that object; "how", "can", "is" cannot ("How do I
# get to", "Can you tell me how to get to" are unfinished). "to" is left out: "What is
# the best way to", "Where do I go to" end unfinished far more often than "Who did you
# talk to?" ends a question (bench/turn_eval.py's synthetic set cut 5 of them).
STRANDING_OPENERS = frozenset({"which", "what", "who", "whom", "whose", "where"})
STRANDED = frozenset({"of", "at", "for", "with", "from", "by", "into", "onto", "about",
                      "like", "through", "between"})
LIKELY, UNLIKELY = 0.9, 0.05
_WORD = re.compile(r"[a-z']+")


def end_of_turn_probability(text: str) -> float:
    """How likely a turn whose transcript so far is `text` is over."""
    text = text.strip().lower()
    if not text:
        return LIKELY  # nothing heard: nothing to wait for
    if text.endswith((",", "-", "...", "…")):
        return UNLIKELY
    words = _WORD.findall(text)
    if words and words[-1] in HOLD_WORDS and not stranded_question(words):
        return UNLIKELY
    if len(words) >= 2 and words[-1] in OBJECT_PRONOUNS and words[-2] in TWO_OBJECT_VERBS:
        return UNLIKELY
    return LIKELY


def stranded_question(words: list[str]) -> bool:
    """A wh-question ending on the preposition its fronted object left behind."""
    return (len(words) >= 4 and words[0] in STRANDING_OPENERS and words[-1] in STRANDED
            and words[-3] != "to")  # "what is the way to get to": the infinitive's own
