"""Warnings of the framework that are no fault of a call, said at the level they deserve.

Silero's VAD (livekit-plugins-silero) warns "VAD inference is slower than realtime" for
every 32 ms window whose inference took over 200 ms: on a busy host (the local mesh's TTS,
thinker and agent on 2 cores) that is dozens of WARNING lines in a normal call, each
telling the same thing. A busy host is measured where it matters (load.py: the loop's lag,
`agent_loop_lag_seconds`, and admission refuses new calls when it is too late), so these
become one INFO line at most every SUMMARY_S, with how many there were, and DEBUG
otherwise.

livekit-agents' transcript synchronizer warns on every barge-in ("playback_finished
called before text/audio input is done", "rotate_segment called while previous segment
is still being rotated"): an interrupted reply's segment ends before its text and audio
are in, which is what a barge-in is. A reply cut while it is still being made also has
its last text and audio land on the closed segment ("push_text / end_text_input /
push_audio / end_audio_input called after close"). Those are DEBUG (`BargeInSegmentFilter`).
"""

from __future__ import annotations

import logging
import time

SILERO_LOGGER = "livekit.plugins.silero"
VAD_SLOW = "VAD inference is slower than realtime"
SUMMARY_S = 30.0


class SlowVADFilter(logging.Filter):
    """On silero's logger: its slow-inference warning -> INFO (a count, at most every
    SUMMARY_S) or DEBUG. Every other record passes unchanged."""

    def __init__(self, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self._clock = clock
        self._last = float("-inf")
        self._since = 0  # slow windows since the last INFO line

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.getMessage() != VAD_SLOW:
            return True
        self._since += 1
        now = self._clock()
        if now - self._last >= SUMMARY_S:
            record.msg = (f"{VAD_SLOW} ({self._since} windows over 200 ms since the last "
                          f"such line): the host is busy (agent_loop_lag_seconds)")
            record.args = None
            record.levelno, record.levelname = logging.INFO, "INFO"
            self._last, self._since = now, 0
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # a handler set to INFO would still show it: the logger's level was checked already
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


AGENTS_LOGGER = "livekit.agents"
BARGE_IN_SEGMENT = (  # the synchronizer's, when a reply is cut (synchronizer.py)
    "_SegmentSynchronizerImpl.playback_finished called before text/audio input is done",
    "rotate_segment called while previous segment is still being rotated",
    # cut while still being made: its rest lands on the segment the cut closed
    *(f"_SegmentSynchronizerImpl.{step} called after close"
      for step in ("push_text", "end_text_input", "push_audio", "end_audio_input")),
)


class BargeInSegmentFilter(logging.Filter):
    """On livekit-agents' logger: the synchronizer's barge-in warnings -> DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.getMessage() not in BARGE_IN_SEGMENT:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_INSTALLED: SlowVADFilter | None = None


def quiet_framework_warnings() -> None:
    """Install the filters above once per process (idempotent)."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = SlowVADFilter()
        logging.getLogger(SILERO_LOGGER).addFilter(_INSTALLED)
        logging.getLogger(AGENTS_LOGGER).addFilter(BargeInSegmentFilter())
