"""Token ids to streamed text, step by step: whole characters only, stop strings never leak."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer
from voice_llm.backends.text import IncrementalDetokenizer, StopMatcher
from voice_llm.tiny_random import model_dir


@pytest.fixture(scope="module")
def tokenizer(cache_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir(cache_dir))


def test_detokenizer_streams_whole_characters(tokenizer) -> None:
    text = "Hello 你好，今天天气很好! 123 🎉"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces), "a piece ended inside a UTF-8 character"
    assert sum(1 for p in pieces if p) > 5, "text must flow out as it is decoded"


def test_detokenizer_drops_special_tokens(tokenizer) -> None:
    ids = tokenizer.encode("hi", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    detok = IncrementalDetokenizer(tokenizer)
    out = "".join(detok.push([i]) for i in [*ids, im_end]) + detok.flush()
    assert out == "hi"


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = ""
    for p in pieces:
        out += matcher.feed(p)
        if matcher.matched:
            return out
    return out + matcher.flush()


@pytest.mark.parametrize(
    ("pieces", "stops", "want", "matched"),
    [
        (["Hello", " wor", "ld. Bye"], ["."], "Hello world", True),
        (["Hel", "lo ST", "OP now"], ["STOP"], "Hello ", True),  # split across pieces
        (["a", "b", "c"], ["bc", "abcd"], "a", True),  # earliest match wins
        (["ST", "ART"], ["STOP"], "START", False),  # held back, then released
        (["x\n", "\n", "y"], ["\n\n"], "x", True),
        (["no stops here"], [], "no stops here", False),
    ],
)
def test_stop_matcher(pieces: list[str], stops: list[str], want: str, matched: bool) -> None:
    m = StopMatcher(stops)
    assert feed_all(m, pieces) == want
    assert m.matched is matched


def test_stop_matcher_never_sends_part_of_a_stop_string() -> None:
    m = StopMatcher(["<END>"])
    sent = [m.feed(p) for p in ["ok <", "E", "N"]]
    assert sent == ["ok ", "", ""]
    assert m.feed("D> more") == "" and m.matched
