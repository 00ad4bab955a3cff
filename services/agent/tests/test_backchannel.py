"""The backchannel policy, and the duplex controller's pause decisions on event orders
real speech cannot pin down (a cough that the recogniser hears as nothing, talk that
goes on past the limit, words that come late).

The session here is a named stand-in (`FrameworkSessionStandIn`: the framework's events
in, `interrupt()` / `clear_user_turn()` counted); the output is our real `SpeakerOutput`,
so pause and resume are the device's. The whole path over a real AgentSession, real
speech and real servers is test_session.py's backchannel and barge-in tests.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from livekit import rtc
from livekit.agents.voice.events import (
    AgentStateChangedEvent,
    UserInputTranscribedEvent,
    UserStateChangedEvent,
)
from voice_agent.audio_io import SpeakerOutput
from voice_agent.backchannel import DEFAULT_WORDS, BackchannelPolicy
from voice_agent.duplex import DuplexController, DuplexState
from voice_agent.metrics import TurnTracker

POLICY = BackchannelPolicy.parse(DEFAULT_WORDS, max_speech_s=0.3, wait_s=0.15)


@pytest.mark.parametrize(("text", "listener_talk"), [
    ("Yeah.", True), ("Uh-hu", True), ("Uh, u", True), ("Um.", True), ("mm-hmm", True),
    ("Okay, I see.", True), ("", True), ("Stop.", False), ("Wait.", False), ("No.", False),
    ("yeah but what about the dragon", False), ("yeah yeah yeah okay right", False),
])
def test_the_policy_tells_listener_talk_from_a_turn(text: str, listener_talk: bool) -> None:
    assert POLICY.is_backchannel(text) is listener_talk


class FrameworkSessionStandIn(rtc.EventEmitter[str]):
    """The AgentSession surface the controller uses, with our real speaker as output."""

    def __init__(self, speaker: SpeakerOutput) -> None:
        super().__init__()
        self.output = SimpleNamespace(audio=speaker)
        self.interrupts = 0
        self.cleared_turns = 0

    def interrupt(self) -> None:
        self.interrupts += 1

    def clear_user_turn(self) -> None:
        self.cleared_turns += 1

    def user(self, old: str, new: str) -> None:
        self.emit("user_state_changed", UserStateChangedEvent(old_state=old, new_state=new))

    def heard(self, text: str) -> None:
        self.emit("user_input_transcribed",
                  UserInputTranscribedEvent(transcript=text, is_final=True))


@pytest.fixture
async def call() -> tuple[FrameworkSessionStandIn, DuplexController, SpeakerOutput]:
    speaker = SpeakerOutput(sample_rate=24000, frame_ms=20)
    speaker.start()
    session = FrameworkSessionStandIn(speaker)
    duplex = DuplexController(session, tracker=TurnTracker(), backchannel=POLICY,  # type: ignore[arg-type]
                              silent_from=speaker.silent_from)
    # a reply is playing: 2 s of tone in the speaker
    await speaker.capture_frame(rtc.AudioFrame(b"\x10\x20" * 48000, 24000, 1, 48000))
    session.emit("agent_state_changed",
                 AgentStateChangedEvent(old_state="thinking", new_state="speaking"))
    await asyncio.sleep(0.1)
    yield session, duplex, speaker
    await speaker.aclose()


def audible_between(speaker: SpeakerOutput, a: float, b: float) -> int:
    return sum(1 for t in speaker.ticks if t.audible and a <= t.at <= b)


async def test_a_cough_with_no_words_resumes_after_the_wait(call) -> None:  # type: ignore[no-untyped-def]
    session, duplex, speaker = call
    session.user("listening", "speaking")
    assert duplex.state == DuplexState.PAUSED
    t0 = duplex.transitions[-1][0]
    await asyncio.sleep(0.1)
    session.user("speaking", "listening")  # no transcript follows
    await asyncio.sleep(0.1)
    assert duplex.state == DuplexState.PAUSED  # still waiting for words
    await asyncio.sleep(0.1)
    assert duplex.state == DuplexState.SPEAKING
    resumed = duplex.transitions[-1][0]
    assert audible_between(speaker, t0 + 0.025, resumed - 0.005) == 0
    await asyncio.sleep(0.2)
    assert audible_between(speaker, resumed, resumed + 0.2) >= 8
    assert duplex.backchannels == 1 and session.cleared_turns == 1
    assert not duplex.barge_ins and session.interrupts == 0


async def test_talk_past_the_limit_is_an_interruption(call) -> None:  # type: ignore[no-untyped-def]
    session, duplex, speaker = call
    session.user("listening", "speaking")
    await asyncio.sleep(0.4)  # no words yet, still talking past max_speech_s
    assert duplex.state == DuplexState.LISTENING and len(duplex.barge_ins) == 1
    b = duplex.barge_ins[0]
    assert b.state_before == DuplexState.SPEAKING and session.interrupts == 1
    assert b.cut_at - b.decided_at >= 0.29  # silent since the pause, cut at the limit
    await asyncio.sleep(0.15)
    assert b.cancel_to_silence_s <= 0.0205
    assert not speaker.playing and speaker._paused is False  # the next reply can play


async def test_words_that_ask_for_the_turn_cut_the_paused_reply(call) -> None:  # type: ignore[no-untyped-def]
    session, duplex, _ = call
    session.user("listening", "speaking")
    await asyncio.sleep(0.05)
    session.user("speaking", "listening")
    session.heard("Wait.")
    assert duplex.state == DuplexState.LISTENING and len(duplex.barge_ins) == 1
    assert session.interrupts == 1 and session.cleared_turns == 0
    # the turn the framework is about to answer is on the tracker now
    assert duplex._tracker.current is not None and duplex._tracker.current.kind == "user"


async def test_backchannel_words_mid_speech_resume_when_the_user_stops(call) -> None:  # type: ignore[no-untyped-def]
    session, duplex, _ = call
    session.user("listening", "speaking")
    session.heard("Yeah.")  # an early final: the user is still talking
    assert duplex.state == DuplexState.PAUSED
    await asyncio.sleep(0.05)
    session.user("speaking", "listening")
    assert duplex.state == DuplexState.SPEAKING and duplex.backchannels == 1
    assert duplex._tracker.current is None  # no user turn was opened
    await asyncio.sleep(0.4)  # the limit's timer was cancelled with the pause
    assert duplex.state == DuplexState.SPEAKING and not duplex.barge_ins


async def test_late_words_after_a_resume_still_cut(call) -> None:  # type: ignore[no-untyped-def]
    session, duplex, _ = call
    session.user("listening", "speaking")
    session.user("speaking", "listening")
    await asyncio.sleep(0.2)  # resumed: no words in the wait
    assert duplex.state == DuplexState.SPEAKING
    session.heard("Stop talking.")
    assert len(duplex.barge_ins) == 1 and session.interrupts == 1


async def test_without_a_policy_speech_cuts_at_once() -> None:
    speaker = SpeakerOutput(sample_rate=24000, frame_ms=20)
    session = FrameworkSessionStandIn(speaker)
    duplex = DuplexController(session, tracker=TurnTracker())  # type: ignore[arg-type]
    session.emit("agent_state_changed",
                 AgentStateChangedEvent(old_state="thinking", new_state="speaking"))
    session.user("listening", "speaking")
    assert DuplexState.PAUSED not in [s for _, s in duplex.transitions]
    assert len(duplex.barge_ins) == 1 and session.interrupts == 1
