"""Bad input gets a clear error (or a clean empty end), never a hang."""

from __future__ import annotations

import threading

import pytest
from voice_tts.engine import (
    AudioPacket,
    Engine,
    EngineSettings,
    SamplingParams,
    SessionParams,
    UnknownVoice,
    UtteranceEnd,
)

pytestmark = pytest.mark.timeout(60)


def test_empty_and_whitespace_text(tiny_engine):
    for text in ["", "   \n\t "]:
        with pytest.raises(ValueError, match="empty"):
            tiny_engine.synthesize(text, "vivian")
    events, done = [], threading.Event()

    def sink(ev) -> None:
        events.append(ev)
        done.set()

    s = tiny_engine.open_session(SessionParams(voice="vivian"), sink)
    s.push_text("  \n ")
    s.flush()
    s.flush()  # a second flush with nothing pending is a no-op
    while not done.is_set():
        tiny_engine.run_once()
    assert events == [UtteranceEnd(0, 0, "eos")]
    s.close()


def test_text_over_limit_is_rejected_fast(tiny_engine):
    big = "word " * 20_000  # 100 kB
    with pytest.raises(ValueError, match="limit"):
        tiny_engine.synthesize(big, "vivian")
    s = tiny_engine.open_session(SessionParams(voice="vivian", max_text_chars=4000), print)
    with pytest.raises(ValueError, match="limit"):
        s.push_text(big)
    s.push_text("x" * 4000)
    with pytest.raises(ValueError, match="limit"):
        s.push_text("y")
    s.close()


def test_invalid_utf8(tiny_engine):
    events = []
    s = tiny_engine.open_session(SessionParams(voice="vivian", max_frames=3), events.append)
    with pytest.raises(ValueError, match="UTF-8"):
        s.push_text(b"caf\xc3\x28")
    with pytest.raises(ValueError, match="str or bytes"):
        s.push_text(42)  # type: ignore[arg-type]
    s.push_text("Still fine.")  # the session survives the bad piece
    s.flush()
    while not any(isinstance(e, UtteranceEnd) for e in events):
        tiny_engine.run_once()
    assert any(isinstance(e, AudioPacket) for e in events)
    s.close()


def test_unknown_voice_language_and_bad_params(tiny_engine):
    with pytest.raises(UnknownVoice, match="voice"):
        tiny_engine.open_session(SessionParams(voice="nobody"), print)
    with pytest.raises(UnknownVoice, match="language"):
        tiny_engine.open_session(SessionParams(voice="vivian", language="klingon"), print)
    with pytest.raises(UnknownVoice):
        tiny_engine.synthesize("Hello.", "nobody")
    assert issubclass(UnknownVoice, ValueError)
    # Dialect names are not selectable languages (official rule).
    with pytest.raises(UnknownVoice):
        tiny_engine.open_session(SessionParams(voice="vivian", language="sichuan_dialect"),
                                 print)
    for bad in (SamplingParams(temperature=0), SamplingParams(top_p=0),
                SamplingParams(top_k=-1), SamplingParams(repetition_penalty=0)):
        with pytest.raises(ValueError):
            tiny_engine.open_session(SessionParams(voice="vivian", sampling=bad), print)
    with pytest.raises(ValueError):
        tiny_engine.open_session(SessionParams(voice="vivian", max_frames=0), print)
    assert tiny_engine.active_sessions == 0
    # Case-insensitive, as the official validation.
    tiny_engine.open_session(SessionParams(voice="Vivian", language="English"), print).close()


def test_decoder_precision_auto_and_unknown() -> None:
    """auto keeps the exact fp32 speech decoder on a CPU; an unknown precision is refused
    before anything is built."""
    import torch

    engine = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=1))
    assert engine.settings.decoder_precision == "auto"
    assert next(engine.model.speech_decoder.parameters()).dtype == torch.float32
    engine.shutdown()
    with pytest.raises(ValueError, match="decoder_precision"):
        EngineSettings(decoder_precision="fp8").validate()
    with pytest.raises(ValueError, match="first_step_apart_max_rows"):
        EngineSettings(first_step_apart_max_rows=-1).validate()


def test_a_prompt_too_long_for_the_cache_ends_only_its_own_utterance():
    """Offline text longer than the KV cache: that session ends "invalid"; the session
    prefilled in the same batch is served as usual; the engine records no fault."""
    e = Engine.from_preset("tiny", seed=0, settings=EngineSettings(max_sessions=2,
                                                                  max_seq_len=64))
    ends: dict[str, list[UtteranceEnd]] = {"long": [], "short": []}

    def sink(name: str):
        return lambda ev: ends[name].append(ev) if isinstance(ev, UtteranceEnd) else None

    long = e.open_session(SessionParams(voice="vivian", seed=1, non_streaming_mode=True),
                          sink("long"))
    short = e.open_session(SessionParams(voice="vivian", seed=1, max_frames=6),
                           sink("short"))
    long.push_text("word " * 80)
    short.push_text("A short one.")
    for s in (long, short):
        s.flush()
    for _ in range(40):
        e.run_once()
    assert [(x.reason, "does not fit" in x.error) for x in ends["long"]] == [("invalid", True)]
    assert [x.reason for x in ends["short"]] == ["max_frames"]
    assert e.faults == 0
