"""The AutoRTC data-message protocol between user bot, probe bot and agent (LiveKit).

Topics and messages (JSON over reliable data packets), after seed 003 11.1 / 13.1 / 14.6:

    probe -> "autortc.probe": {"type": "probe_ready", "trace_id", "case_id"}
                              (sent once the agent's audio track delivered its first frame)
    agent -> "autortc.agent": {"type": "agent_ready", "trace_id", "case_id"}
                              (the agent saw probe_ready and its track is published)
                              {"type": "reply_start" | "reply_end", "trace_id", "case_id",
                               "reply_seq", "agent_trace_id"?}
    user  -> "autortc.user":  {"type": "case_start" | "eot", "trace_id", "case_id"}
    agent -> "latency":       the agent's per-turn latency report (trace_id = its turn id,
                              eot_to_first_audio_ms, llm_ttft_ms, tts_ttfa_ms, ...)

The user bot starts speaking only after BOTH probe_ready and agent_ready (the D10
double ACK). Reply marks are matched on (trace_id, case_id, reply_seq), and start and
end must carry the same reply_seq; a mark with another trace_id (a stale agent from
an earlier case) is ignored (seed 003 13.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

TOPIC_PROBE = "autortc.probe"
TOPIC_AGENT = "autortc.agent"
TOPIC_USER = "autortc.user"
TOPIC_LATENCY = "latency"


def encode(kind: str, trace_id: str, case_id: str, **extra: object) -> bytes:
    return json.dumps({"type": kind, "trace_id": trace_id, "case_id": case_id, **extra},
                      separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, object] | None:
    """A message dict, or None for anything that is not a JSON object."""
    try:
        msg = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return msg if isinstance(msg, dict) else None


@dataclass
class ReplyMarks:
    """reply_start / reply_end marks of one case, stamped with the probe's clock."""

    trace_id: str
    case_id: str
    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    ignored: int = 0  # stale or foreign marks
    agent_trace_ids: list[str] = field(default_factory=list)

    def add(self, msg: dict[str, object], at: float) -> bool:
        kind = msg.get("type")
        if kind not in ("reply_start", "reply_end"):
            return False
        seq = msg.get("reply_seq")
        if (msg.get("trace_id") != self.trace_id or msg.get("case_id") != self.case_id
                or not isinstance(seq, int)):
            self.ignored += 1
            return False
        (self.starts if kind == "reply_start" else self.ends).setdefault(seq, at)
        atid = msg.get("agent_trace_id")
        if isinstance(atid, str) and atid not in self.agent_trace_ids:
            self.agent_trace_ids.append(atid)
        return True

    def first_reply(self, after: float | None = None) -> tuple[float, float] | None:
        """(start, end) of the first complete reply starting at/after `after`."""
        for seq in sorted(self.starts):
            s = self.starts[seq]
            if (after is None or s >= after) and seq in self.ends and self.ends[seq] >= s:
                return s, self.ends[seq]
        return None
