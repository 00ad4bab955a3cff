"""How much text each packet had read (`AudioPacket.text_chars`): the text stream keeps
the characters behind each committed id, the talker reads one text id per frame, so a
packet says the characters of the ids up to its last frame's; counts restart per
utterance, an offline prompt has read everything, and an EOS end says all of it."""

from __future__ import annotations

import threading

import pytest
from voice_tts.engine import AudioPacket, Engine, EngineSettings, SessionParams, UtteranceEnd
from voice_tts.engine.demo_tokenizer import demo_tokenizer
from voice_tts.engine.text import ROLE_LEN, ROLE_PREFIX, TextStream, TextTokenizer

SENTENCE = "Hello there, streaming world. héllo 你好!"


class Collector:
    def __init__(self) -> None:
        self.events: list = []
        self.ends = threading.Semaphore(0)

    def __call__(self, ev) -> None:
        self.events.append(ev)
        if isinstance(ev, UtteranceEnd):
            self.ends.release()

    def wait_end(self) -> UtteranceEnd:
        assert self.ends.acquire(timeout=60), "no UtteranceEnd within 60 s"
        return [e for e in self.events if isinstance(e, UtteranceEnd)][-1]

    def packets(self, utt: int) -> list[AudioPacket]:
        return [e for e in self.events if isinstance(e, AudioPacket) and e.utterance_id == utt]


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(demo_tokenizer(), 100_000, 100_001)


@pytest.fixture(scope="module")
def engine():
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=4))
    e.start()
    yield e
    e.shutdown()


def expected(tokenizer: TextTokenizer, text: str, frames: int) -> int:
    """Characters behind text ids 0..frames-1 (the whole text tokenized at once: for NFC
    text the streamed ids are the same)."""
    ids, ends = tokenizer.encode_ends(ROLE_PREFIX + text)
    j = ROLE_LEN - 2 + frames  # ids start with "assistant", "\n"
    return len(text) if j >= len(ids) else ends[j] - len(ROLE_PREFIX)


@pytest.mark.parametrize("pieces", [
    ["Hel", "lo there, str", "eaming world. h", "éllo ", "你", "好!"],
    [SENTENCE.encode()[i:i + 3] for i in range(0, len(SENTENCE.encode()), 3)],  # mid-UTF-8
])
def test_stream_counts_characters_as_pushed(tokenizer, pieces) -> None:
    s = TextStream(tokenizer, 1000)
    seen = []
    for p in pieces:
        s.push(p)
        seen.append([s.chars_read(n) for n in range(1, len(s.committed) - ROLE_LEN + 1)])
    s.finish()
    n_ids = len(s.committed) - ROLE_LEN
    final = [s.chars_read(n) for n in range(n_ids + 2)]
    assert final == [0] + [expected(tokenizer, SENTENCE, n) for n in range(1, n_ids + 2)]
    assert final == sorted(final) and final[-1] == final[-2] == len(SENTENCE) == s.chars
    for partial in seen:  # what was committed early never changes
        assert partial == final[1:len(partial) + 1]


def test_stream_counts_decomposed_text_as_sent(tokenizer) -> None:
    """NFC composes "e" + U+0301 into one character; the count is the client's."""
    text = "Cafe\u0301 au lait, s'il vous plai\u0302t. Merci."
    s = TextStream(tokenizer, 1000)
    for i in range(0, len(text), 4):
        s.push(text[i:i + 4])
    s.finish()
    counts = [s.chars_read(n) for n in range(1, len(s.committed) - ROLE_LEN + 1)]
    assert counts == sorted(counts) and counts[-1] == len(text) == s.chars
    # "Café" (5 characters sent) is behind the ids up to its end.
    assert 5 in counts or counts[0] > 5


def test_packets_say_what_the_talker_had_read(engine, tokenizer) -> None:
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=3, max_frames=40), c)
    for i in range(0, len(SENTENCE), 5):
        s.push_text(SENTENCE[i:i + 5])
    s.flush()
    end = c.wait_end()
    packets = c.packets(0)
    chars = [p.text_chars for p in packets]
    assert chars[0] > 0 and chars == sorted(chars)
    for p in packets[:-1]:  # the last frame k has read text ids 0..k
        assert p.text_chars == expected(tokenizer, SENTENCE, p.first_frame + p.frames)
    last = end.text_chars if end.reason == "eos" else packets[-1].text_chars
    assert last == len(SENTENCE)

    # The next utterance counts from its own start.
    s.push_text("Second one, 你好.")
    s.flush()
    end = c.wait_end()
    second = [p.text_chars for p in c.packets(1)]
    assert second[0] == expected(tokenizer, "Second one, 你好.", 1)
    assert second == sorted(second)
    assert (end.text_chars if end.reason == "eos" else second[-1]) == len("Second one, 你好.")

    # After a cancel (barge-in), a new utterance starts over too.
    s.push_text("This one is dropped at once, long before it ends.")
    s.cancel()
    s.push_text("Fresh start.")
    s.flush()
    while (end := c.wait_end()).reason == "cancelled":
        pass
    fresh = c.packets(end.utterance_id)
    assert fresh[0].text_chars == expected(tokenizer, "Fresh start.", 1)
    s.close()


def test_frame_cap_reports_what_was_read(engine, tokenizer) -> None:
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=3), c)
    s.push_text(SENTENCE)
    s.flush()
    end = c.wait_end()
    assert end.reason == "max_frames" and end.frames == 3
    packets = c.packets(0)
    assert packets[-1].final and packets[-1].text_chars == expected(tokenizer, SENTENCE, 3)
    assert end.text_chars == packets[-1].text_chars < len(SENTENCE)
    s.close()


def test_offline_prompt_has_read_everything(engine) -> None:
    c = Collector()
    s = engine.open_session(SessionParams(voice="vivian", seed=1, max_frames=6,
                                          non_streaming_mode=True), c)
    s.push_text(SENTENCE)
    s.flush()
    c.wait_end()
    assert {p.text_chars for p in c.packets(0)} == {len(SENTENCE)}
    s.close()
