"""The agent's side of AutoRTC's data protocol (the wire format: `marks.py`).

An AutoRTC case puts a user bot and a probe bot in the agent's room. The user bot speaks
only after two acks: `probe_ready` from the probe (the agent's audio reached it) and
`agent_ready` from the agent; the probe times each reply by the agent's `reply_start` /
`reply_end` marks. So the agent, in its LiveKit room:

- on `case_start` (TOPIC_USER) or `probe_ready` (TOPIC_PROBE): adopts that
  (trace_id, case_id) as the current case (reply numbers restart at 1);
- on `probe_ready`: answers `agent_ready` on TOPIC_AGENT;
- when its state turns to speaking / leaves speaking: sends `reply_start` / `reply_end`
  with the case's ids, the reply's number (`reply_seq`) and its own turn id
  (`agent_trace_id`, the id in its logs and latency reports).

Outside an AutoRTC case (no case seen) it sends nothing. Malformed or foreign messages
are ignored: the room is shared with people and other bots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .marks import (
    AGENT_READY,
    CASE_START,
    PROBE_READY,
    REPLY_END,
    REPLY_START,
    TOPIC_AGENT,
    TOPIC_PROBE,
    TOPIC_USER,
    decode_case_message,
    encode,
)

log = logging.getLogger("voice_agent.autortc")

# (topic, type) of the messages that open a case
_CASE_OPENERS = ((TOPIC_USER, CASE_START), (TOPIC_PROBE, PROBE_READY))


class AutoRTCMarks:
    def __init__(self, send: Callable[[bytes, str], None],
                 turn_id: Callable[[], str | None] = lambda: None) -> None:
        """send(payload, topic) publishes a reliable data message; turn_id() is the agent's
        current turn id, if any."""
        self._send, self._turn_id = send, turn_id
        self.case: tuple[str, str] | None = None  # (trace_id, case_id)
        self.reply_seq = 0
        self._speaking = False

    def on_data(self, topic: str | None, payload: bytes) -> None:
        if topic not in (TOPIC_USER, TOPIC_PROBE):
            return
        msg = decode_case_message(payload)
        if msg is None or (topic, msg["type"]) not in _CASE_OPENERS:
            return
        case = (msg["trace_id"], msg["case_id"])
        if self.case != case:
            self.case, self.reply_seq = case, 0
            log.info("autortc case %s trace_id=%s", case[1], case[0])
        if msg["type"] == PROBE_READY:
            self._emit(AGENT_READY)

    def on_state(self, old: str, new: str) -> None:
        """The agent session's state change (listening, thinking, speaking, ...)."""
        if new == "speaking" and not self._speaking:
            self._speaking = True
            if self.case is not None:
                self.reply_seq += 1
                self._emit(REPLY_START, reply_seq=self.reply_seq)
        elif old == "speaking" and new != "speaking" and self._speaking:
            self._speaking = False
            if self.case is not None and self.reply_seq:
                self._emit(REPLY_END, reply_seq=self.reply_seq)

    def _emit(self, kind: str, **extra: object) -> None:
        assert self.case is not None
        if kind != AGENT_READY and (turn := self._turn_id()):
            extra["agent_trace_id"] = turn
        self._send(encode(kind, *self.case, **extra), TOPIC_AGENT)
