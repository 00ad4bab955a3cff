"""The end-of-turn policy (conversation/turn_end.py): a bounded hold, a complete question
ending in a preposition released at once, unfinished words holding whatever the audio
says, a failing detector falling back to the words, and the Realtime API's eagerness."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from voice_agent.conversation.turn_end import (
    DETECTOR_ERRORS,
    AudioDetector,
    FusedDetector,
    TurnEnd,
    WordDetector,
    end_of_turn_wait,
    endpointing,
)
from voice_agent.settings import AgentSettings


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
    wait = await end_of_turn_wait(s, turn, text)
    assert wait == s.max_endpointing_delay_s <= 1.0  # held: the user may go on, not 3 s
    assert turn.last is not None and turn.last.wait_s == wait and turn.last.p_end < 0.5


@pytest.mark.parametrize("text", [
    "Which platform does the next train to Boston leave from?",
    "What are you looking at?", "Who did you go with", "Could you call my sister at six?",
])
async def test_a_complete_question_ending_in_a_preposition_is_released_at_once(
        text: str) -> None:
    s = AgentSettings()
    assert await end_of_turn_wait(s, TurnEnd(s, WordDetector()), text) \
        == s.min_endpointing_delay_s


async def test_unfinished_words_hold_the_turn_whatever_the_audio() -> None:
    s = AgentSettings()
    turn = TurnEnd(s, FusedDetector(Unreachable()))
    audio = np.zeros(16000, np.float32)
    assert await turn.p_end("I need to get to the", audio) < 0.5
    assert turn.last is not None and not turn.last.fallback


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


def test_semantic_vad_eagerness_scales_the_waits() -> None:
    s = AgentSettings(min_endpointing_delay_s=0.3, max_endpointing_delay_s=1.0)
    assert endpointing(s, "auto") == endpointing(s, "medium") == (0.3, 1.0)
    assert endpointing(s, "high") == (0.15, 0.5)
    assert endpointing(s, "low") == (0.6, 2.0)
