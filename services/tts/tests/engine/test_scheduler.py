"""The scheduler is CPU bookkeeping: sessions in, a plain `SchedulerOutput` out, ends
decided from a step's tokens. No model, no runner: sessions with text and hand-set state."""

from __future__ import annotations

import pytest
from voice_tts.engine import EngineFull, EngineSettings, SessionParams
from voice_tts.engine.config import ModelConfig
from voice_tts.engine.demo_tokenizer import demo_tokenizer
from voice_tts.engine.scheduler import Need, Row, Scheduler
from voice_tts.engine.session import Session
from voice_tts.engine.text import TextTokenizer
from voice_tts.engine.voices import VoiceTable

CFG = ModelConfig.from_name("tiny")
TOK = TextTokenizer(demo_tokenizer(), CFG.im_start_token_id, CFG.im_end_token_id)
EOS = CFG.talker.codec_eos_token_id


def make(**settings) -> Scheduler:
    return Scheduler(EngineSettings(**settings), CFG)


def open_session(sched: Scheduler, text: str | None = None, flush: bool = True,
                 **params) -> Session:
    voice = VoiceTable(CFG.talker).resolve("vivian", "auto")
    p = SessionParams(voice="vivian", seed=0, **params)
    s = sched.add(lambda sid, slot: Session(sid, slot, p, voice, None, lambda ev: None, TOK,
                                            wake=lambda: None, release=sched.remove))
    if text is not None:
        s.push_text(text)
        if flush:
            s.flush()
    return s


def running(s: Session, steps: int, last_active: float) -> Session:
    utt = s.head()
    assert utt is not None
    utt.running, utt.steps, utt.last_active, utt.prompt_len = True, steps, last_active, 20
    return s


def ids(rows: list[Row]) -> list[int]:
    return [row.session.id for row in rows]


def test_policy() -> None:
    sched = make(max_batch=8, max_prefills_per_step=1)
    a = running(open_session(sched, "One more sentence to say."), 1, 5.0)
    b = open_session(sched, "Hello there, friend.")  # fresh, flushed
    c = open_session(sched)  # nothing yet
    d = running(open_session(sched, "Another sentence, a long one."), 2, 2.0)
    e = open_session(sched, "   ")  # flushed with nothing to say
    b.head().created, e.head().created = 3.0, 9.0
    out = sched.schedule()
    assert ids(out.prefill) == [b.id]  # one prompt per step
    # every ready session, least recently stepped first; the fresh prompt joins at once
    assert ids(out.decode) == [d.id, a.id, b.id]
    assert ids(out.end_empty) == [e.id] and not out.cancelled
    assert c.id not in ids(out.decode + out.prefill)
    # The joiner's first step completes the frame its prompt began: no talker, no text.
    assert out.talk == [True, True, False] and out.text_ids[-1] == CFG.tts_pad_token_id
    assert out.text_ids[:2] == [d.head().stream.ids().text[2], a.head().stream.ids().text[1]]
    assert Scheduler(EngineSettings(batch_decode=False), CFG).max_batch == 1


def test_speech_from_the_first_word() -> None:
    """A streaming prompt starts once its first text id is stable and speaks its frame 0
    in the same iteration; its talker steps wait for each next text id."""
    sched = make()
    s = open_session(sched, "Hello", flush=False)
    assert sched.schedule().idle  # "Hello" may still grow
    s.push_text(" ")  # "Hello" is followed by a space: stable, one text id
    out = sched.schedule()
    assert ids(out.prefill) == [s.id] and ids(out.decode) == [s.id] and out.talk == [False]
    running(s, 1, 1.0)  # its prompt ran and frame 0 is out
    assert sched.schedule().idle  # frame 1 needs text id 1: not there yet
    s.push_text("world")  # " world" may still grow
    assert sched.schedule().idle
    s.push_text(" ")
    out = sched.schedule()
    assert ids(out.decode) == [s.id] and out.talk == [True]
    assert out.text_ids == [s.head().stream.ids().text[1]]


def test_next_text_ids_then_eos_then_pad() -> None:
    sched = make()
    s = open_session(sched, "Hello there, friend.")
    utt = s.head()
    text = utt.stream.ids()
    assert text.role == TOK.role_ids
    row, seen = Row(s, utt), []
    for steps in range(1, len(text.text) + 3):  # step 0: frame 0, no talker
        utt.steps = steps
        seen.append(sched.next_text_id(row, text))
    assert seen == [*text.text[1:], CFG.tts_eos_token_id, CFG.tts_pad_token_id,
                    CFG.tts_pad_token_id]


def test_paused_ending_and_cancelled_sessions() -> None:
    sched = make()
    a = running(open_session(sched, "Some text here."), 1, 1.0)
    b = running(open_session(sched, "Some text here."), 1, 1.0)
    a.pause()
    b.head().ending = "eos"
    assert sched.need(a, a.head(), a.head().stream.ids()) is Need.NOTHING
    assert sched.schedule().idle
    dropped = b.head()
    b.cancel()
    out = sched.schedule()
    assert [row.utt for row in out.cancelled] == [dropped]


def test_update_marks_eos_and_the_frame_cap() -> None:
    sched = make()
    a = running(open_session(sched, "Some text here."), 0, 1.0)
    b = running(open_session(sched, "Some text here.", max_frames=2), 1, 1.0)
    rows = [Row(a, a.head()), Row(b, b.head())]
    sched.update(rows, [EOS, 7])
    assert a.head().ending == "eos" and a.head().steps == 1
    assert b.head().ending == "max_frames" and b.head().steps == 2


def test_slots_are_taken_and_given_back() -> None:
    sched = make(max_sessions=2)
    a, b = open_session(sched), open_session(sched)
    assert {a.slot, b.slot} == {0, 1}
    with pytest.raises(EngineFull):
        open_session(sched)
    a.close()
    assert sched.active == 1 and open_session(sched).slot == a.slot


def test_a_sampled_id_past_the_codebooks_fails_the_step() -> None:
    """The graphed step indexes without checks: a codebook-0 id that is neither a code nor
    EOS (the sampler's edge drew 2306 once) must fail loudly, not play on as audio."""
    sched = make(max_batch=8)
    a = running(open_session(sched, "One more sentence to say."), 1, 1.0)
    b = running(open_session(sched, "Another sentence to say."), 1, 2.0)
    rows = [Row(a, a.head()), Row(b, b.head())]
    codes = CFG.speech_decoder.codebook_size
    sched.update(rows, [codes - 1, EOS])  # the last code and EOS are fine
    assert b.head().ending == "eos"
    with pytest.raises(IndexError, match=rf"\({a.slot}, {codes}\)"):
        sched.update(rows, [codes, 5])


def test_more_ready_sessions_than_the_batch_take_turns() -> None:
    """Open streams may outnumber the rows one step advances (TTS_MAX_BATCH): the least
    recently stepped go first, so every session gets its turn."""
    sched = make(max_sessions=6, max_batch=2)
    a, b, c = (running(open_session(sched, f"Sentence number {i} to say."), 1, t)
               for i, t in enumerate((3.0, 1.0, 2.0)))
    assert ids(sched.schedule().decode) == [b.id, c.id]
    b.head().last_active, c.head().last_active = 4.0, 5.0  # stepped
    assert ids(sched.schedule().decode) == [a.id, b.id]
