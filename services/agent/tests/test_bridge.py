"""The bridge's segmentation on LLM-like token streams (Chinese and English).

Token streams are cut the way LLM tokenizers cut text: 1–4 characters a piece, pieces
that split words, punctuation glued to either side. Whatever the cut, the segments
must concatenate back to the text (the TTS concatenates pieces itself), the first 6
characters go out piece by piece as they come (the starter), then punctuation must
flush and no segment may run past the length rule.
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


def after_starter(segs: list[Segment], starter_max: int = 6) -> list[Segment]:
    """The segments after the starter (all of reason "starter", until starter_max chars
    have gone), checking that none after it is one."""
    sent = 0
    for i, s in enumerate(segs):
        if sent >= starter_max:
            assert all(t.reason != "starter" for t in segs[i:]), segs
            return segs[i:]
        assert s.reason == "starter", (i, segs)
        sent += len(s.text)
    return []


@pytest.mark.parametrize("text", [ZH, EN], ids=["zh", "en"])
@pytest.mark.parametrize("seed", range(20))
def test_segments_rebuild_the_stream_and_follow_the_rules(text: str, seed: int) -> None:
    segs = run(text, seed)
    assert "".join(s.text for s in segs) == text
    for s in after_starter(segs)[:-1]:
        if s.reason == "length":
            # 8–12 at a word boundary, or a shorter run to the last boundary (never a cut word)
            assert len(s.text) <= 12, s
        if s.reason == "punct":
            assert s.text.rstrip()[-1] in "，。！？,.!?;:；：、…", s


def test_the_starter_goes_out_piece_by_piece() -> None:
    """The TTS engine commits a word once what follows shows it ended, and starts there:
    "I" is spoken once " can" has arrived, not after " help"."""
    seg = TextSegmenter()
    assert [s.text for s in seg.push("I")] == ["I"]
    assert [s.text for s in seg.push(" can")] == [" can"]
    assert [s.text for s in seg.push(" help")] == [" help"]  # 10 chars sent: grouped after
    assert seg.push(" you") == [] and seg.pending == " you"


def test_a_starters_sentence_end_waits_for_its_space_where_sentences_flush() -> None:
    """"Hi." may be "Hi.5" or "Hi. How": where each sentence is FLUSHed (in-context
    clones) the stop is held until the next piece shows it ends one; elsewhere it goes."""
    assert [s.text for s in TextSegmenter().push("Hi.")] == ["Hi."]
    seg = TextSegmenter(flushes=True)
    assert [s.text for s in seg.push("Hi")] == ["Hi"]
    assert seg.push(".") == [] and seg.pending == "."
    got = seg.push(" How")
    assert [(s.text, s.ends_sentence) for s in got] == [(". ", True), ("How", False)]
    seg = TextSegmenter(flushes=True)
    assert [s.text for s in seg.push("Sure,")] == ["Sure,"]  # a comma goes at once


def test_chinese_punctuation_flushes_at_once() -> None:
    seg = TextSegmenter()
    assert [s.text for s in seg.push("您好很高兴见到")] == ["您好很高兴见到"]  # the starter
    assert [s.text for s in seg.push("你好，")] == ["你好，"]  # cut at the comma
    assert seg.push("我是") == []
    assert [s.text for s in seg.push("助手。今")] == ["我是助手。"]
    assert seg.pending == "今"


def test_english_punctuation_waits_for_the_space() -> None:
    seg = TextSegmenter()
    assert [s.text for s in seg.push("Well well")] == ["Well well"]  # the starter
    assert [s.text for s in seg.push("Hi")] == []
    assert seg.push("!") == []  # "Hi!" could still become "Hi!?" or "Hi!x"
    assert [s.text for s in seg.push(" there")] == ["Hi! "]
    assert seg.push(" 3.") == [] and seg.push("14") == []  # a decimal point is not a stop


def test_unpunctuated_chinese_is_cut_every_8_to_12_chars() -> None:
    text = "我们一起去公园散步然后回家吃饭再看一部电影"
    segs = run(text, 0)
    for s in after_starter(segs)[:-1]:
        assert s.reason == "length" and 8 <= len(s.text) <= 12


def test_english_is_cut_at_word_boundaries() -> None:
    segs = run(EN, 3)
    words = set(EN.split())
    for s in after_starter(segs)[:-1]:
        last = s.text.split()[-1] if s.text.split() else ""
        assert s.text.endswith(" ") or last in words or s.reason == "punct", s


def test_config_is_honoured() -> None:
    cfg = BridgeConfig(starter_min_chars=1, starter_max_chars=3, min_chars=20, max_chars=30)
    segs = run(ZH.replace("，", "").replace("。", "").replace("！", ""), 1, cfg)
    assert all(20 <= len(s.text) <= 30 for s in after_starter(segs, 3)[:-1])


def test_bad_config_fails_fast() -> None:
    with pytest.raises(ValueError):
        BridgeConfig(starter_min_chars=7, starter_max_chars=6)
    with pytest.raises(ValueError):
        BridgeConfig(min_chars=13, max_chars=12)
