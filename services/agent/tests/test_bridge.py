"""The bridge's segmentation on LLM-like token streams (Chinese and English).

Token streams are cut the way LLM tokenizers cut text: 1–4 characters a piece, pieces
that split words, punctuation glued to either side. Whatever the cut, the segments
must concatenate back to the text (the TTS concatenates pieces itself), the first
segment must be a 2–6 character starter, punctuation must flush, and no segment may
run past the length rule.
"""

from __future__ import annotations

import random

import pytest
from voice_agent.bridge import BridgeConfig, Segment, TextSegmenter

ZH = "你好，我是你的语音助手。今天天气很好，我们一起去公园散步吧！然后回家吃饭好不好"
EN = ("Sure! The weather today is sunny and warm, so a walk in the park sounds great. "
      "Remember to bring water, e.g. a small bottle, and maybe 3.14 snacks")


def llm_pieces(text: str, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rnd.randint(1, 4)
        out.append(text[i:i + n])
        i += n
    return out


def run(text: str, seed: int, cfg: BridgeConfig | None = None) -> list[Segment]:
    seg = TextSegmenter(cfg or BridgeConfig())
    out: list[Segment] = []
    for piece in llm_pieces(text, seed):
        out += seg.push(piece)
    return out + seg.finish()


@pytest.mark.parametrize("text", [ZH, EN], ids=["zh", "en"])
@pytest.mark.parametrize("seed", range(20))
def test_segments_rebuild_the_stream_and_follow_the_rules(text: str, seed: int) -> None:
    segs = run(text, seed)
    assert "".join(s.text for s in segs) == text
    first = segs[0]
    assert first.reason == "starter"
    assert 2 <= len(first.text.rstrip()) <= 7  # 2–6 chars (+ the space kept after a word)
    for s in segs[1:-1]:
        if s.reason == "length":
            # 8–12 at a word boundary, or a shorter run to the last boundary (never a cut word)
            assert len(s.text) <= 12, s
        if s.reason == "punct":
            assert s.text.rstrip()[-1] in "，。！？,.!?;:；：、…", s


def test_chinese_punctuation_flushes_at_once() -> None:
    seg = TextSegmenter()
    assert [s.text for s in seg.push("你好，")] == ["你好，"]  # starter cut at the comma
    assert seg.push("我是") == []
    assert [s.text for s in seg.push("助手。今")] == ["我是助手。"]
    assert seg.pending == "今"


def test_english_punctuation_waits_for_the_space() -> None:
    seg = TextSegmenter()
    assert [s.text for s in seg.push("Hi")] == []
    assert seg.push("!") == []  # "Hi!" could still become "Hi!?" or "Hi!x"
    assert [s.text for s in seg.push(" there")] == ["Hi! "]
    assert seg.push(" 3.") == [] and seg.push("14") == []  # a decimal point is not a stop


def test_unpunctuated_chinese_is_cut_every_8_to_12_chars() -> None:
    text = "我们一起去公园散步然后回家吃饭再看一部电影"
    segs = run(text, 0)
    assert segs[0].reason == "starter" and len(segs[0].text) <= 6
    for s in segs[1:-1]:
        assert s.reason == "length" and 8 <= len(s.text) <= 12


def test_english_is_cut_at_word_boundaries() -> None:
    segs = run(EN, 3)
    words = set(EN.split())
    for s in segs[:-1]:
        last = s.text.split()[-1] if s.text.split() else ""
        assert s.text.endswith(" ") or last in words or s.reason == "punct", s


def test_config_is_honoured() -> None:
    cfg = BridgeConfig(starter_min_chars=1, starter_max_chars=3, min_chars=20, max_chars=30)
    segs = run(ZH.replace("，", "").replace("。", "").replace("！", ""), 1, cfg)
    assert len(segs[0].text) <= 3
    assert all(20 <= len(s.text) <= 30 for s in segs[1:-1])


def test_bad_config_fails_fast() -> None:
    with pytest.raises(ValueError):
        BridgeConfig(starter_min_chars=7, starter_max_chars=6)
    with pytest.raises(ValueError):
        BridgeConfig(min_chars=13, max_chars=12)
