"""Issue 51, item 13: silero's per-window "VAD inference is slower than realtime" (dozens
of WARNING lines in a normal call on a busy 2-core host) is one counted INFO line at most
every 30 s once the agent has loaded its VAD, DEBUG otherwise; silero's other warnings
stay warnings."""

from __future__ import annotations

import logging

import pytest
from voice_agent import quiet_logs
from voice_agent.conversation.parts import load_vad
from voice_agent.settings import AgentSettings

SLOW = "VAD inference is slower than realtime"


def test_slow_vad_windows_are_no_warnings_once_the_vad_is_loaded(
        caplog: pytest.LogCaptureFixture) -> None:
    load_vad(AgentSettings())  # as every pipeline does
    silero = logging.getLogger("livekit.plugins.silero")
    caplog.set_level(logging.DEBUG)
    for delay in range(20):
        silero.warning(SLOW, extra={"delay": delay / 10})
    silero.warning("max_buffered_speech reached, ignoring further data")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    warnings = [m for lvl, m in levels if lvl == "WARNING"]
    assert warnings == ["max_buffered_speech reached, ignoring further data"], levels
    infos = [m for lvl, m in levels if lvl == "INFO"]
    assert len(infos) <= 1 and all(m.startswith(SLOW) and "host is busy" in m for m in infos)
    assert len(levels) == 21  # the rest are DEBUG, still there for whoever asks


def test_the_summary_line_counts_the_slow_windows_between_lines() -> None:
    now = [0.0]
    f = quiet_logs.SlowVADFilter(clock=lambda: now[0])
    logger = logging.getLogger("livekit.plugins.silero")

    def rec() -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, SLOW, None, None)

    first = rec()
    assert f.filter(first) and first.levelno == logging.INFO
    assert "(1 windows" in first.getMessage()
    for _ in range(5):
        r = rec()
        f.filter(r)
        assert r.levelno == logging.DEBUG
    now[0] = quiet_logs.SUMMARY_S
    later = rec()
    assert f.filter(later) and later.levelno == logging.INFO
    assert "(6 windows" in later.getMessage()


def test_the_synchronizers_barge_in_warnings_are_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 62, item 10: a barge-in logged two livekit warnings every time (an
    interrupted reply's segment ends before its text is in: that is the barge-in), and a
    reply cut while still being made one more (its last text lands on the closed
    segment: test_ws_talk.py's barge-in, 1 run in 4 on 2 cores)."""
    load_vad(AgentSettings())
    agents = logging.getLogger("livekit.agents")
    caplog.set_level(logging.DEBUG)
    for msg in quiet_logs.BARGE_IN_SEGMENT:
        agents.warning(msg)
    agents.warning("some other warning")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [m for lvl, m in levels if lvl == "WARNING"] == ["some other warning"], levels
    assert len(levels) == len(quiet_logs.BARGE_IN_SEGMENT) + 1
