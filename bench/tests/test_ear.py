"""bench/ear.py's word error rate: the figure that chose the agent's offline ear."""

from __future__ import annotations

import pytest

from bench.ear import wer


def test_wer_counts_edits_over_the_reference_words() -> None:
    assert wer("what is the weather", "what is the weather") == 0.0
    assert wer("What is the weather?", "what is the, weather") == 0.0  # case, punctuation
    assert wer("a b c", "a x c") == pytest.approx(1 / 3)  # a substitution
    assert wer("a b c", "a c") == pytest.approx(1 / 3)  # a deletion
    assert wer("a b", "a b c d") == pytest.approx(1.0)  # two insertions
    assert wer("hello there", "") == 1.0
