"""The conversation every door runs (conversation/core.py): a door's background work ends
with it, and a user turn's words reach the door once the ear has them."""

from __future__ import annotations

import asyncio

from voice_agent.conversation.core import Conversation
from voice_agent.settings import AgentSettings


async def test_closing_a_conversation_ends_the_work_its_door_started() -> None:
    conv = Conversation(AgentSettings())
    forever = conv.spawn(asyncio.sleep(3600))
    await conv.aclose()
    assert forever.cancelled()


async def test_a_turns_words_reach_the_door_once_the_ear_has_them() -> None:
    """Audio mode: the turn's text is the ear's marker, and the door is told the words
    when the ear writes them, not the marker; any other text at once."""
    conv = Conversation(AgentSettings(stt_mode="audio"))
    store = conv.pipeline.stt.utterances
    assert store is not None
    said: list[str] = []
    conv.when_heard("What time is it?", said.append)
    assert said == ["What time is it?"]
    marker = store.put(b"\0" * 32000)
    conv.when_heard(marker, said.append)
    await asyncio.sleep(0.05)
    assert said == ["What time is it?"]  # the ear has not said yet
    store.heard(marker, "book a table for two")
    await asyncio.sleep(0.01)
    assert said[-1] == "book a table for two"
    await conv.aclose()
