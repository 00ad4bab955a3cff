"""The AutoRTC data-message contract: topics and JSON shapes (one copy, imported by both sides).

An AutoRTC case (services/autortc) puts a user bot and a probe bot in the agent's room;
they and the agent talk over reliable data packets, JSON objects, after seed 003
11.1 / 13.1 / 14.6:

    probe -> TOPIC_PROBE:   {"type": "probe_ready", "trace_id", "case_id"}
                            (the agent's audio track delivered its first frame)
    agent -> TOPIC_AGENT:   {"type": "agent_ready", "trace_id", "case_id"}
                            {"type": "reply_start" | "reply_end", "trace_id", "case_id",
                             "reply_seq", "agent_trace_id"?}
    user  -> TOPIC_USER:    {"type": "case_start" | "eot", "trace_id", "case_id"}
    agent -> TOPIC_LATENCY: `LatencyRecord`, one per turn (trace_id = the agent's turn id)

The user bot speaks only after BOTH probe_ready and agent_ready (the D10 double ACK).
Reply marks are matched on (trace_id, case_id, reply_seq). This module is the wire
format only: who sends what when is `autortc_marks.py` (agent) and the bots (AutoRTC).
It is not in proto/ because it rides LiveKit's data channel, not gRPC.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NotRequired, TypedDict

TOPIC_PROBE = "autortc.probe"
TOPIC_AGENT = "autortc.agent"
TOPIC_USER = "autortc.user"
TOPIC_LATENCY = "latency"  # also the web page's topic (AgentSettings.latency_topic)

# message types ("type")
CASE_START, EOT = "case_start", "eot"  # user
PROBE_READY = "probe_ready"  # probe
AGENT_READY, REPLY_START, REPLY_END = "agent_ready", "reply_start", "reply_end"  # agent


class CaseMessage(TypedDict):
    """Every AutoRTC message: its type and the case it belongs to."""

    type: str
    trace_id: str
    case_id: str


class ReplyMark(CaseMessage):
    """reply_start / reply_end: the agent began / stopped speaking its reply no. reply_seq."""

    reply_seq: int
    agent_trace_id: NotRequired[str]  # the agent's turn id (its logs, its LatencyRecord)


class LatencyRecord(TypedDict):
    """The agent's per-turn latency report (metrics.LATENCY_KEYS, in this order)."""

    trace_id: str
    eot_to_first_audio_ms: float | None
    llm_ttft_ms: float | None
    tts_ttfa_ms: float | None


def encode(kind: str, trace_id: str, case_id: str, **extra: object) -> bytes:
    """One message, compact JSON, keys in the documented order."""
    return json.dumps({"type": kind, "trace_id": trace_id, "case_id": case_id, **extra},
                      separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, object] | None:
    """A message dict, or None for anything that is not a JSON object (the room is shared
    with people and other bots: garbage is dropped, never raised)."""
    try:
        msg = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return msg if isinstance(msg, dict) else None


def decode_case_message(payload: bytes) -> CaseMessage | None:
    """A message whose type, trace_id and case_id are strings, else None."""
    msg = decode(payload)
    if msg is None:
        return None
    kind, trace_id, case_id = msg.get("type"), msg.get("trace_id"), msg.get("case_id")
    if not (isinstance(kind, str) and isinstance(trace_id, str) and isinstance(case_id, str)):
        return None
    return CaseMessage(type=kind, trace_id=trace_id, case_id=case_id)


# The report's keys, in order: the web page's schema.
LATENCY_KEYS: tuple[str, ...] = tuple(LatencyRecord.__annotations__)


def encode_latency(record: Mapping[str, object]) -> bytes:
    """A LatencyRecord as the worker publishes it (plain json.dumps, as the page reads it)."""
    return json.dumps(record).encode()
