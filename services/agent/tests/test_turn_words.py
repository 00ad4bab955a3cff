"""The text end-of-turn detector: the transcript's last word, through the framework's
turn detector protocol and the session's turn handling."""

from __future__ import annotations

import pytest
from livekit.agents import llm
from voice_agent.conversation.turn_end import TurnEnd, WordDetector
from voice_agent.turn_words import (
    LIKELY,
    UNLIKELY,
    end_of_turn_probability,
)

from .test_settings import load_settings


@pytest.mark.parametrize(("text", "p"), [
    ("I want to", UNLIKELY), ("My name is", UNLIKELY), ("I would like", UNLIKELY),
    ("Book me a table for two and", UNLIKELY), ("Well, um", UNLIKELY), ("So,", UNLIKELY),
    ("I want to book a table for two.", LIKELY), ("What is the weather like today?", LIKELY),
    ("Can you do that", LIKELY), ("Come in", LIKELY), ("", LIKELY), ("Thank you!", LIKELY),
    ("Can you tell me", UNLIKELY), ("Please remind me.", UNLIKELY), ("Show us", UNLIKELY),
    ("Call me", LIKELY), ("Tell me more", LIKELY), ("Help me", LIKELY),
    # a wh-question ends on the preposition its object left behind; other openers do not
    ("Which platform does the next train to Boston leave from?", LIKELY),
    ("Which platform does the next train to Austin Lee from", LIKELY),  # as the ear heard it
    ("What are you looking at", LIKELY), ("Who did you go with?", LIKELY),
    ("Where are you from", LIKELY), ("What is this for?", LIKELY),
    ("Can you tell me how to get to", UNLIKELY), ("How do I get to", UNLIKELY),
    ("What is the best way to get to", UNLIKELY), ("What I want is the", UNLIKELY),
    ("What is the best way to", UNLIKELY), ("Who did you talk to", LIKELY),
    ("Who is", UNLIKELY), ("What is the weather like", LIKELY),
    # ... a clause's too, and a question's fronted object of "want" or "like"
    ("Let me know what you are looking for.", LIKELY), ("It is nothing to be afraid of.", LIKELY),
    ("That is the one I was thinking of.", LIKELY), ("Who should I send the invoice to?", LIKELY),
    ("Which one do you want?", LIKELY), ("What would you like", LIKELY),
    ("Which one do we want?", LIKELY), ("What do they need", LIKELY),
    ("What I want", UNLIKELY), ("I need something for", UNLIKELY), ("Give me one of", UNLIKELY),
    ("I am looking for", UNLIKELY), ("Where do I go to", UNLIKELY),
    # a number is a word: the ear writes "six" as "6" (16 of the GPU sweep callers' 27
    # complete turns held 1 s were "My flight number is 74211.")
    ("My flight number is 74211.", LIKELY), ("Could you call my sister at 6?", LIKELY),
    ("Meet me at 6:30", LIKELY), ("My number is 555 and", UNLIKELY),
])
def test_the_last_word_says_whether_more_is_coming(text: str, p: float) -> None:
    assert end_of_turn_probability(text) == p


async def test_the_framework_asks_it_about_the_newest_user_words() -> None:
    d = TurnEnd(load_settings(), WordDetector())
    ctx = llm.ChatContext()
    ctx.add_message(role="user", content="Hello there.")
    ctx.add_message(role="assistant", content="Hi, how can I help?")
    ctx.add_message(role="user", content="I want to")
    threshold = await d.unlikely_threshold(None)
    assert threshold is not None
    assert await d.predict_end_of_turn(ctx) < threshold  # -> max_endpointing_delay_s
    ctx.add_message(role="user", content="book a table.")
    assert await d.predict_end_of_turn(ctx) > threshold  # -> min_endpointing_delay_s
    assert await d.supports_language(None) and await d.supports_language("en-US")
    assert not await d.supports_language("zh")  # the silence policy there


async def test_by_default_it_sits_behind_the_vad() -> None:
    from voice_agent.agent import build_pipeline

    p = build_pipeline(load_settings())  # the default
    d = p.session.options.turn_handling["turn_detection"]
    assert isinstance(d, TurnEnd) and isinstance(d.detector, WordDetector)
