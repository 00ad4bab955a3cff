"""The agent's side of AutoRTC's data protocol (services/autortc, `protocol.py`).

An AutoRTC case puts a user bot and a probe bot in the agent's room. The user bot speaks
only after two acks: `probe_ready` from the probe (the agent's audio reached it) and
`agent_ready` from the agent; the probe times each reply by the agent's `reply_start` /
`reply_end` marks. So the agent, in its LiveKit room:

- on `case_start` (topic "autortc.user") or `probe_ready` (topic "autortc.probe"):
  adopts that (trace_id, case_id) as the current case (reply numbers restart at 1);
- on `probe_ready`: answers `agent_ready` on topic "autortc.agent";
- when its state turns to speaking / leaves speaking: sends `reply_start` / `reply_end`
  with the case's ids, the reply's number (`reply_seq`) and its own turn id
  (`agent_trace_id`, the id in its logs and latency reports).

Outside an AutoRTC case (no case seen) it sends nothing. Malformed or foreign messages
are ignored: the room is shared with people and other bots.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

log = logging.getLogger("voice_agent.autortc")

TOPIC_PROBE = "autortc.probe"
TOPIC_AGENT = "autortc.agent"
TOPIC_USER = "autortc.user"


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
        try:
            msg = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return
        if not isinstance(msg, dict):
            return
        trace_id, case_id = msg.get("trace_id"), msg.get("case_id")
        if not (isinstance(trace_id, str) and isinstance(case_id, str)):
            return
        kind = msg.get("type")
        if (topic, kind) not in ((TOPIC_USER, "case_start"), (TOPIC_PROBE, "probe_ready")):
            return
        if self.case != (trace_id, case_id):
            self.case, self.reply_seq = (trace_id, case_id), 0
            log.info("autortc case %s trace_id=%s", case_id, trace_id)
        if kind == "probe_ready":
            self._emit("agent_ready")

    def on_state(self, old: str, new: str) -> None:
        """The agent session's state change (listening, thinking, speaking, ...)."""
        if new == "speaking" and not self._speaking:
            self._speaking = True
            if self.case is not None:
                self.reply_seq += 1
                self._emit("reply_start", reply_seq=self.reply_seq)
        elif old == "speaking" and new != "speaking" and self._speaking:
            self._speaking = False
            if self.case is not None and self.reply_seq:
                self._emit("reply_end", reply_seq=self.reply_seq)

    def _emit(self, kind: str, **extra: object) -> None:
        assert self.case is not None
        trace_id, case_id = self.case
        msg: dict[str, object] = {"type": kind, "trace_id": trace_id, "case_id": case_id,
                                  **extra}
        if kind != "agent_ready" and (turn := self._turn_id()):
            msg["agent_trace_id"] = turn
        self._send(json.dumps(msg, separators=(",", ":")).encode(), TOPIC_AGENT)
