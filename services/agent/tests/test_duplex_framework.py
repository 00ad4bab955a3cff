"""The one framework private the agent reads (duplex.framework_last_speaking_time): the
attribute chain must exist in the installed livekit-agents, and anything else must fall
back to None, never raise. If a livekit-agents upgrade fails the first test, find the
new home of the VAD's last speaking time (or drop the back-dating: the duplex controller
then uses the configured hangover)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from livekit.agents.voice import Agent, AgentSession
from livekit.agents.voice.agent_activity import AgentActivity
from livekit.agents.voice.audio_recognition import AudioRecognition
from voice_agent.duplex import framework_last_speaking_time


async def test_the_installed_framework_has_the_attribute_chain() -> None:
    session = AgentSession()
    assert hasattr(session, "_activity"), "AgentSession._activity is gone"
    activity = AgentActivity(Agent(instructions="-"), session)
    assert hasattr(activity, "_audio_recognition"), "AgentActivity._audio_recognition is gone"
    assert isinstance(vars(AudioRecognition).get("last_speaking_time"), property), \
        "AudioRecognition.last_speaking_time is no longer a property"
    assert framework_last_speaking_time(session) is None  # not started: no activity yet


def test_reads_the_chain() -> None:
    recognition = SimpleNamespace(last_speaking_time=1234.5)
    session = SimpleNamespace(_activity=SimpleNamespace(_audio_recognition=recognition))
    assert framework_last_speaking_time(session) == 1234.5  # type: ignore[arg-type]


@pytest.mark.parametrize("session", [
    SimpleNamespace(),  # no _activity
    SimpleNamespace(_activity=None),
    SimpleNamespace(_activity=SimpleNamespace()),  # no _audio_recognition
    SimpleNamespace(_activity=SimpleNamespace(_audio_recognition=SimpleNamespace(
        last_speaking_time=None))),  # nobody spoke yet
    SimpleNamespace(_activity=SimpleNamespace(_audio_recognition=SimpleNamespace(
        last_speaking_time="12"))),  # a changed type
])
def test_falls_back_to_none(session: SimpleNamespace) -> None:
    assert framework_last_speaking_time(session) is None  # type: ignore[arg-type]
