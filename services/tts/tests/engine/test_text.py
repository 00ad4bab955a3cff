"""Streaming text: pieces (str or bytes, split anywhere, even inside a UTF-8 character)
commit exactly the ids of the whole text; only stable ids are committed early."""

from __future__ import annotations

import random

import pytest
from voice_tts.engine.demo_tokenizer import demo_tokenizer
from voice_tts.engine.text import TextStream, TextTokenizer

TEXTS = [
    "Hello there, streaming world.",
    "It's 3:45 pm -- don't   stop!  Really?\n\nNew paragraph.",
    "你好，欢迎使用语音合成服务。",
    "Café naïve über, emojis 🙂🎉 and e\u0301 combining.",
    "  leading spaces and trailing   ",
]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer(demo_tokenizer(), 151644, 151645)


def _stream(tok, pieces) -> list[int]:
    s = TextStream(tok, 10_000)
    for p in pieces:
        s.push(p)
    s.finish()
    return s.committed


@pytest.mark.parametrize("text", TEXTS)
def test_every_split_point_str_and_bytes(tok, text):
    whole = tok.assistant_ids(text)[: -len(tok.suffix_ids)]
    data = text.encode()
    for cut in range(len(text) + 1):
        assert _stream(tok, [text[:cut], text[cut:]]) == whole, cut
    for cut in range(len(data) + 1):  # cuts inside multi-byte characters included
        assert _stream(tok, [data[:cut], data[cut:]]) == whole, cut


@pytest.mark.parametrize("text", TEXTS)
def test_random_pieces(tok, text):
    whole = tok.assistant_ids(text)[: -len(tok.suffix_ids)]
    rng = random.Random(0)
    data = text.encode()
    for _ in range(20):
        pieces, i = [], 0
        while i < len(data):
            n = rng.randint(1, 4)
            pieces.append(data[i:i + n])
            i += n
        assert _stream(tok, pieces) == whole


def test_committed_ids_never_change(tok):
    text = TEXTS[1]
    whole = tok.assistant_ids(text)[: -len(tok.suffix_ids)]
    s = TextStream(tok, 10_000)
    for ch in text:
        s.push(ch)
        assert whole[: len(s.committed)] == s.committed
    s.finish()
    assert s.committed == whole


def test_first_word_waits_for_next_character(tok):
    s = TextStream(tok, 100)
    s.push("Hello")
    assert len(s.committed) == 3  # role ids only: "Hello" may still grow
    s.push(" ")
    assert len(s.committed) > 3


def test_invalid_utf8_and_limits(tok):
    s = TextStream(tok, 10)
    with pytest.raises(ValueError, match="UTF-8"):
        s.push(b"\xff\xfe")
    s.push(b"\xe4\xbd")  # first two bytes of a 3-byte character: fine so far
    with pytest.raises(ValueError, match="incomplete UTF-8"):
        s.push("x")
    s.push(b"\xa0")  # completes U+4F60
    with pytest.raises(ValueError, match="limit"):
        s.push("x" * 10)
    s.push("abc")  # the rejected piece left no trace
    with pytest.raises(ValueError, match="surrogate"):
        s.push("\ud800")
    s.finish()
    assert tok.tok.decode(s.committed[3:]) == "你abc"
    t = TextStream(tok, 10)
    t.push(b"\xe4")
    with pytest.raises(ValueError, match="inside a UTF-8"):
        t.finish()


def test_same_ids_as_transformers_qwen2_tokenizer(tmp_path, tok):
    """Our Qwen2 pipeline (tokenizers, from vocab.json + merges.txt) equals transformers'
    `Qwen2Tokenizer.from_pretrained` on the same files (run in the oracle venv)."""
    import json
    import subprocess

    from voice_tts.engine.demo_tokenizer import write_demo_tokenizer
    from voice_tts.engine.text import ROLE_PREFIX, TextTokenizer, load_text_tokenizer

    from .lib import oracle_python

    python = oracle_python()
    if python is None:
        pytest.skip("no oracle interpreter")
    write_demo_tokenizer(tmp_path)
    texts = [ROLE_PREFIX + t for t in TEXTS] + ["assistant\n\nnewline first",
                                               "assistant\nI'LL WE'VE 12345 x\r\ny"]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = ("import json, sys\nfrom transformers import Qwen2Tokenizer\n"
            "tok = Qwen2Tokenizer.from_pretrained(sys.argv[1])\n"
            "texts = json.load(open(sys.argv[2]))\n"
            "print(json.dumps([tok(t, add_special_tokens=False)['input_ids'] for t in texts]))")
    out = subprocess.run([str(python), "-c", code, str(tmp_path), str(tmp_path / "texts.json")],
                         capture_output=True, text=True, timeout=120, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = TextTokenizer(load_text_tokenizer(tmp_path), 151644, 151645)
    assert [ours.encode(t) for t in texts] == theirs
