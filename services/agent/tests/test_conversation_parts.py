"""One place makes a conversation's parts (conversation/parts.py): a setting changed once
reaches every door. `/v1/talk`, `/v1/realtime`, LiveKit rooms and direct mode all build
their conversation with it (agent.py build_pipeline): the bridge, the flush on sentences,
the ear's early pass, the audio STT mode and the turn tracker were once dropped by the
Realtime door.

No backend is called: the parts are built, not used."""

from __future__ import annotations

from typing import Any

import pytest
from voice_agent.agent import build_pipeline
from voice_agent.bridge import BridgeConfig
from voice_agent.conversation.parts import Parts, turn_handling
from voice_agent.conversation.turn_end import TurnEnd, WordDetector, turn_detector
from voice_agent.metrics import TurnTracker
from voice_agent.realtime.session import RealtimeSession
from voice_agent.settings import AgentSettings

CHANGED = dict(bridge_starter_min_chars=3, bridge_starter_max_chars=5, bridge_min_chars=7,
               bridge_max_chars=9, bridge_flush_on_sentence=True, stt_early_pass=False,
               stt_mode="audio", tts_voice="serena", tts_frame_ms=40, llm_max_tokens=77)


def check(parts: Parts, tracker: TurnTracker) -> None:
    tts_opts = parts.tts._opts
    assert tts_opts.bridge == BridgeConfig(starter_min_chars=3, starter_max_chars=5,
                                           min_chars=7, max_chars=9)
    assert tts_opts.flush_on_sentence is True
    assert tts_opts.voice == "serena" and tts_opts.frame_ms == 40
    assert parts.stt.early_pass is False
    # the audio STT mode: the ear and the thinker share one utterance store
    assert parts.stt._utterances is not None and parts.stt._utterances is parts.llm._utterances
    assert parts.llm._opts.max_tokens == 77
    # every part reports to the conversation's turn tracker: its turns are in the metrics
    assert parts.stt._tracker is tracker and parts.llm._tracker is tracker
    assert parts.tts._tracker is tracker and parts.vad._on_speech_end == tracker.vad_speech_ended
    # one end-of-turn detector, hearing the conversation's audio (its tracker's)
    assert isinstance(parts.turn, TurnEnd) and parts.turn.tracker is tracker
    assert isinstance(parts.turn.detector, WordDetector)


async def test_a_setting_reaches_the_talk_door() -> None:
    p = build_pipeline(AgentSettings(**CHANGED))  # what TalkSession (and the worker) build
    try:
        turn = p.session.options.turn_handling["turn_detection"]
        check(Parts(stt=p.stt, llm=p.llm, tts=p.tts, vad=p.session.vad,  # type: ignore[arg-type]
                    turn=turn), p.tracker)
        assert p.session.vad is not None
    finally:
        await p.session.aclose()


async def test_a_setting_reaches_the_realtime_door() -> None:
    async def voice(name: str) -> str:
        return name

    rt = RealtimeSession(AgentSettings(**CHANGED), lambda _: None, beta=False,
                         check_voice=voice)
    try:
        p = rt.pipeline  # the same session as /v1/talk's: its policy, its duplex controller
        check(Parts(stt=p.stt, llm=p.llm, tts=p.tts, vad=p.vad, turn=p.turn), rt.tracker)
        talk = build_pipeline(AgentSettings(**CHANGED)).session.options.turn_handling
        realtime = p.session.options.turn_handling
        assert {**realtime, "turn_detection": None} == {**talk, "turn_detection": None}
        assert p.duplex is not None
        assert rt.tts._opts.sample_rate == 24000  # the Realtime API's own rate
    finally:
        await rt.close()


@pytest.mark.parametrize("mode", ["text", "vad"])
def test_one_end_of_turn_policy(mode: str) -> None:
    s = AgentSettings(turn_detection=mode, min_endpointing_delay_s=0.4,
                      max_endpointing_delay_s=2.5)
    th: dict[str, Any] = turn_handling(s, turn_detector(s))
    assert th["endpointing"] == {"mode": "fixed", "min_delay": 0.4, "max_delay": 2.5}
    assert (th["turn_detection"] == "vad") == (mode == "vad")
