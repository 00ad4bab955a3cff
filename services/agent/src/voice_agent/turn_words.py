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
# "Which platform does the next train leave from?", "What are you looking at?", "Who did you
# go with?"; so does a clause inside a sentence ("Let me know what you are looking for.",
# "That is the one I was thinking of.", "It is nothing to be afraid of."). Held, such a
# complete turn waited 1-2.7 s (11 of 11 on the H200 sweep; 7 of 171 turns of the synthetic
# set spoken in the GPU sweep). The fronted word opens the question or the clause, at least
# two words before the preposition; "how", "can", "is" cannot front it ("How do I get to",
# "Can you tell me how to get to" are unfinished). "to" only after "who"/"whom" ("Who
# should I send it to?"): "What is the best way to", "Where do I go to" end unfinished far
# more often (bench/turn_eval.py's synthetic set cut 5 of them).
STRANDING_OPENERS = frozenset({"which", "what", "who", "whom", "whose", "where"})
CLAUSE_HEADS = STRANDING_OPENERS | frozenset({"nothing", "something", "anything",
                                              "everything", "one"})
STRANDED = frozenset({"of", "at", "for", "with", "from", "by", "into", "onto", "about",
                      "like", "through", "between"})
# "Which one do you want?", "What would you like?", "Which one do we need?": a question's
# object fronted from "want" or "like" after its subject and an auxiliary ("What I want"
# is unfinished: no auxiliary). The ear writes "we" for "you" (1 of 160 synthetic turns).
ASKED_VERBS = frozenset({"want", "like", "need"})
SUBJECTS = frozenset({"you", "we", "they", "i", "he", "she"})
AUXILIARIES = frozenset({"do", "does", "did", "would", "will", "could", "should", "can"})
LIKELY, UNLIKELY = 0.9, 0.05
_WORD = re.compile(r"[a-z0-9']+")  # "at 6", "74211": a number ends a turn as its words do


def end_of_turn_probability(text: str) -> float:
    """How likely a turn whose transcript so far is `text` is over."""
    text = text.strip().lower()
    if not text:
        return LIKELY  # nothing heard: nothing to wait for
    if text.endswith((",", "-", "...", "…")):
        return UNLIKELY
    words = _WORD.findall(text)
    if words and words[-1] in HOLD_WORDS and not stranded(words):
        return UNLIKELY
    if len(words) >= 2 and words[-1] in OBJECT_PRONOUNS and words[-2] in TWO_OBJECT_VERBS:
        return UNLIKELY
    return LIKELY


def stranded(words: list[str]) -> bool:
    """A question or clause ending on the word its fronted object left behind."""
    if len(words) < 4:
        return False
    last, heads = words[-1], words[:-3]
    if last in ASKED_VERBS and words[-2] in SUBJECTS and words[-3] in AUXILIARIES \
            and any(w in STRANDING_OPENERS for w in heads):
        return True
    if last == "to":
        return words[0] in ("who", "whom")
    return last in STRANDED and words[-3] != "to" and (  # "what is the way to get to"
        words[0] in STRANDING_OPENERS or any(w in CLAUSE_HEADS for w in heads))
