"""The end-of-turn policy (conversation/turn_end.py): a bounded hold, a complete question
ending in a preposition released at once, unfinished words holding whatever the audio
says, words the ear doubts, a failing detector falling back to the words, and the
Realtime API's eagerness."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from livekit.agents import llm
from voice_agent.conversation.turn_end import (
    DETECTOR_ERRORS,
    AudioDetector,
    FusedDetector,
    TurnEnd,
    TurnView,
    WordDetector,
    eagerness_scale,
    endpointing,
    make_detector,
)
from voice_agent.settings import AgentSettings
from voice_agent.sphinx import Heard


async def wait_after(turn: TurnEnd, text: str) -> float:
    """The wait after the last speech sample the turn's decision on `text` implies."""
    await turn.p_end(text)
    assert turn.last is not None
    return turn.last.wait_s


class Unreachable:
    """An audio model that must not be asked (the words decided)."""

    async def predict(self, audio: np.ndarray) -> float:
        raise AssertionError("the audio model was asked")


@pytest.mark.parametrize("text", [
    "Can you tell me how to get to", "My number is five five five and", "Well, um",
])
async def test_a_doubted_turn_waits_at_most_a_second_by_default(text: str) -> None:
    s = AgentSettings()
    turn = TurnEnd(s, WordDetector())
    wait = await wait_after(turn, text)
    assert wait == s.max_endpointing_delay_s <= 1.0  # held: the user may go on, not 3 s
    assert turn.last is not None and turn.last.wait_s == wait and turn.last.p_end < 0.5


@pytest.mark.parametrize("text", [
    "Which platform does the next train to Boston leave from?",
    "What are you looking at?", "Who did you go with", "Could you call my sister at six?",
])
async def test_a_complete_question_ending_in_a_preposition_is_released_at_once(
        text: str) -> None:
    s = AgentSettings()
    assert await wait_after(TurnEnd(s, WordDetector()), text) == s.min_endpointing_delay_s


async def test_unfinished_words_hold_the_turn_whatever_the_audio() -> None:
    s = AgentSettings()
    turn = TurnEnd(s, FusedDetector(Unreachable()))
    audio = np.zeros(16000, np.float32)
    assert await turn.p_end("I need to get to the", audio) < 0.5
    assert turn.last is not None and not turn.last.fallback


async def test_audio_mode_decides_on_the_ears_words_not_the_markers() -> None:
    """AGENT_STT_MODE=audio: the turn's transcript is utterance markers (the thinker hears
    the audio). The word rule reads a marker as a finished sentence, so a paused turn was
    cut (22 of 24 on the H200 sweep); it now decides on the background ear's words, waited
    for within the shortest endpointing delay, the marker if they are late."""
    from voice_agent.plugins.utterances import UtteranceStore

    s = AgentSettings(stt_mode="audio", min_endpointing_delay_s=0.2)
    store = UtteranceStore()
    turn = TurnEnd(s, WordDetector())
    turn.utterances = store
    first, second = store.put(bytes(3200)), store.put(bytes(3200))
    store.heard(first, "can you tell me how to get to")
    assert await wait_after(turn, first) == s.max_endpointing_delay_s  # held
    assert turn.last is not None and turn.last.transcript == "can you tell me how to get to"
    # the ear says the whole turn's second part while the turn waits: it ends
    asyncio.get_running_loop().call_later(0.05, store.heard, second, "the nearest pharmacy")
    assert await wait_after(turn, f"{first} {second}") == s.min_endpointing_delay_s
    assert turn.last.transcript == "can you tell me how to get to the nearest pharmacy"
    late = store.put(bytes(3200))  # no words within the wait: the marker, as before
    assert await turn.p_end(late, wait=(0.05, 1.0)) >= 0.5
    assert turn.last.transcript == late


async def test_a_failing_audio_model_falls_back_to_the_words_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    s = AgentSettings()
    turn = TurnEnd(s, AudioDetector(Unreachable()))  # no audio kept: it cannot decide
    before = DETECTOR_ERRORS.labels(detector="audio")._value.get()
    with caplog.at_level(logging.WARNING, logger="voice_agent.turn_end"):
        p = await turn.p_end("Can you tell me how to get to")
    assert p < 0.5  # the word rule's answer
    assert turn.last is not None and turn.last.fallback
    assert DETECTOR_ERRORS.labels(detector="audio")._value.get() == before + 1
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


class Going:
    """The conversation's VAD as the short turn's wait sees it."""

    def __init__(self, resuming: bool) -> None:
        self.resuming = resuming


@pytest.mark.parametrize("resuming", [False, True])
async def test_a_word_or_two_waits_a_little_longer_and_speech_keeps_the_turn(
        resuming: bool) -> None:
    """"Hello." may be "Hello, can you hear me?" with a comma's pause, longer than the
    hangover for a slow speaker: a turn of a word or two that the words find complete waits
    short_turn_delay_s after its last speech sample (a longer turn: the framework's short
    wait alone), and is held if the caller goes on meanwhile."""
    import time

    from voice_agent.metrics import TurnTracker
    from voice_agent.speech_end import SpeechEnd

    s = AgentSettings()
    tracker = TurnTracker()
    turn = TurnEnd(s, WordDetector(), tracker)
    turn.vad = going = Going(False)
    ctx = llm.ChatContext.empty()

    async def decide(text: str) -> tuple[float, float]:
        now = time.perf_counter()
        tracker.vad_speech_ended(SpeechEnd(at=now - 0.2, decided=now, silence_s=0.2))
        ctx.add_message(role="user", content=text)
        p = await turn.predict_end_of_turn(ctx)
        return p, time.perf_counter() - (now - 0.2)

    p, after = await decide("What is the weather like today?")
    assert p >= 0.5 and after < s.short_turn_delay_s - 0.05  # no wait of its own
    going.resuming = resuming
    p, after = await decide("Hello.")
    assert turn.last is not None and turn.last.wait_s == s.short_turn_delay_s
    assert after >= s.short_turn_delay_s - 0.01, after
    assert (p < 0.5) == resuming, p
    # any turn the caller already went on from is held (their START, on its way to the
    # framework, reopens it)
    p, after = await decide("What is the weather like today?")
    assert (p < 0.5) == resuming and after < s.short_turn_delay_s - 0.05, p


def test_semantic_vad_eagerness_scales_the_waits() -> None:
    s = AgentSettings(min_endpointing_delay_s=0.3, max_endpointing_delay_s=1.0)
    assert endpointing(s, "auto") == endpointing(s, "medium") == (0.3, 1.0)
    assert endpointing(s, "high") == (0.15, 0.5)
    assert endpointing(s, "low") == (0.6, 2.0)
    # the policy's own wait for a word or two scales with them
    turn = TurnEnd(s, WordDetector())
    for eagerness in ("high", "auto", "low"):
        turn.scale = eagerness_scale(eagerness)
        lo, hi = turn.delays
        assert (lo, hi) == pytest.approx(endpointing(s, eagerness))
        assert turn.wait_s("Hello.", 0.9, lo, hi) == pytest.approx(
            s.short_turn_delay_s * turn.scale)
        assert turn.wait_s("Can you tell me", 0.05, lo, hi) == pytest.approx(hi)


async def test_the_audio_model_hears_the_turn_as_the_vad_ended_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`fused` on the real Smart Turn file: asked at the VAD's end of speech (before the
    transcript), its answer is the one the decision uses; words that cannot end a turn
    hold it whatever the audio says."""
    import time

    from voice_agent import smart_turn
    from voice_agent.metrics import TurnTracker
    from voice_agent.speech_end import SpeechEnd

    from .backends import espeak

    s = AgentSettings(turn_detection="fused")
    tracker = TurnTracker()
    turn = TurnEnd(s, FusedDetector(smart_turn.load()), tracker)
    pcm = np.concatenate([espeak("I would like to book a table for two tonight.", tmp_path),
                          np.zeros(3200, np.int16)])  # the VAD's 200 ms of silence
    now = time.perf_counter()
    tracker.vad_speech_ended(SpeechEnd(at=now - 0.2, decided=now, silence_s=0.2, audio=pcm,
                                       rate=16000, audio_end_s=len(pcm) / 16000 - 0.2))
    assert turn._early is not None  # asked at once
    p = await turn.p_end("I would like to book a table for two tonight.")
    assert p == await turn._early[2]
    assert turn.last is not None and turn.last.stop_s is not None and not turn.last.fallback
    assert len(turn.last.audio) == len(pcm)  # type: ignore[arg-type]
    assert await turn.p_end("I would like to book a table for") < 0.5


def test_a_missing_audio_model_fails_the_start_naming_the_file_and_the_fix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    missing = tmp_path / "nowhere" / "smart-turn.onnx"
    env = {**os.environ, "AGENT_TURN_DETECTION": "fused",
           "AGENT_SMART_TURN_MODEL": str(missing), "AGENT_HTTP_PORT": "0"}
    r = subprocess.run([sys.executable, "-m", "voice_agent", "serve-direct"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert str(missing) in r.stderr and "make venvs" in r.stderr, r.stderr


class Ear:
    """The conversation's STT as the policy reads it: its latest final, as heard."""

    def __init__(self, heard: Heard | None) -> None:
        self.last_heard = heard


async def test_words_the_ear_doubts_are_in_doubt_and_only_this_turns() -> None:
    """With AGENT_TURN_EAR_MIN_END set, the ear wrote words that could end a turn but
    was unsure they ended there (its end token unlikely): the long wait, as for
    unfinished words. Sure, or another utterance's doubt, or the default: the short one."""
    s = AgentSettings(turn_ear_min_end=0.95)
    turn = TurnEnd(s, make_detector(s))  # type: ignore[arg-type]
    lo, hi = s.min_endpointing_delay_s, s.max_endpointing_delay_s
    turn.ear = Ear(Heard("I need to come to turn.", p_end=0.0, p_last=0.44))
    assert await wait_after(turn, "I need to come to turn.") == hi
    turn.ear = Ear(Heard("Tell me about it", p_end=0.58, p_last=0.34))  # "about the ..."
    assert await wait_after(turn, "Yes. Tell me about it") == hi  # the turn ends with it
    turn.ear = Ear(Heard("Tell me about it.", p_end=0.999, p_last=0.98))
    assert await wait_after(turn, "Tell me about it.") == lo
    turn.ear = Ear(Heard("something else", p_end=0.1, p_last=0.1))  # not these words
    assert await wait_after(turn, "Tell me about it.") == lo
    turn.ear = Ear(None)  # an ear that says nothing of its doubt: the words alone
    assert await wait_after(turn, "Tell me about it.") == lo
    # an unsure last word is no doubt by default ("Tell me something nice." was heard
    # "... something, eyes." at 0.35); AGENT_TURN_EAR_MIN_LAST makes it one
    turn.ear = Ear(Heard("Tell me something, eyes.", p_end=0.9998, p_last=0.35))
    assert await wait_after(turn, "Tell me something, eyes.") == lo
    last = AgentSettings(turn_ear_min_end=0.95, turn_ear_min_last=0.4)
    turn = TurnEnd(last, make_detector(last))  # type: ignore[arg-type]
    turn.ear = Ear(Heard("Tell me something, eyes.", p_end=0.9998, p_last=0.35))
    assert await wait_after(turn, "Tell me something, eyes.") == hi
    off = AgentSettings()  # the default: the words alone
    turn = TurnEnd(off, make_detector(off))  # type: ignore[arg-type]
    turn.ear = Ear(Heard("I need to come to turn.", p_end=0.0, p_last=0.44))
    assert await wait_after(turn, "I need to come to turn.") == lo


async def test_the_ear_doubts_a_sentence_cut_at_its_pause(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Real Moonshine on espeak-ng (synthetic speech): "I need to return <600 ms> the
    shoes" cut at its pause is written as words that could end a turn, which the words
    alone would end; the ear's doubt holds it. The whole sentence is released."""
    import subprocess

    from voice_agent.direct import read_wav_16k
    from voice_agent.sphinx import _moonshine

    path = tmp_path / "pause.wav"
    subprocess.run(["espeak-ng", "-m", "-v", "en-us", "-s", "170", "-w", str(path),
                    "I need to return <break time='600ms'/> the shoes I bought last week."],
                   check=True)
    pcm = read_wav_16k(path)
    x = pcm[:len(pcm) // 160 * 160].astype(np.float64).reshape(-1, 160) / 32768
    loud = np.flatnonzero(10 * np.log10((x ** 2).mean(axis=1) + 1e-12) > -45)
    stop = (loud[np.flatnonzero(np.diff(loud) >= 30)[0]] + 1) * 160  # the 600 ms pause
    hear = _moonshine(1)
    s = AgentSettings(turn_ear_min_end=0.95)
    for audio, done in ((pcm[:stop + 3200], False), (pcm, True)):  # + the 200 ms hangover
        heard = hear(audio.tobytes())
        view = TurnView(heard.text, ear=heard)
        p = await make_detector(s).p_end(view)  # type: ignore[union-attr]
        assert (p >= 0.5) == done, heard
        if not done:  # the words alone would have ended it
            assert await WordDetector().p_end(TurnView(heard.text)) >= 0.5, heard
