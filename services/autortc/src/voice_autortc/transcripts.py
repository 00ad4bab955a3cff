"""Word error rate of what the agent heard against what the test user said.

The reference is the case's input text (SSML tags removed, plus the barge-in text when
there is one); the hypothesis is every user message the agent added to its chat, in
order. Both are lower-cased and stripped of punctuation: the recogniser writes neither.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(_TAG.sub(" ", text).lower())


def wer(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words (Levenshtein on words)."""
    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1] / len(ref)


def heard(chat: list[dict[str, object]]) -> str:
    """The user's side of the conversation as the agent transcribed it."""
    return " ".join(str(m.get("text") or "") for m in chat if m.get("role") == "user")
