"""The agent's AutoRTC acks and reply marks (voice_agent.autortc_marks): the messages
services/autortc's user and probe bots wait for (protocol.py there). No LiveKit server
runs here, so the room's data channel is the one thing replaced: by the `sent` list and
direct `on_data` calls; the reply marks come from the real agent session's states.
The wire format itself (voice_agent.marks) is test_marks.py's."""

from __future__ import annotations

import json
import time
from pathlib import Path

from voice_agent.autortc_marks import AutoRTCMarks
from voice_agent.direct import DirectSession
from voice_agent.duplex import DuplexState
from voice_agent.marks import TOPIC_AGENT, TOPIC_PROBE, TOPIC_USER

from .backends import Server, espeak
from .test_session import make_settings


def msg(kind: str, trace: str = "t1", case: str = "c1") -> bytes:
    return json.dumps({"type": kind, "trace_id": trace, "case_id": case}).encode()


def collect() -> tuple[AutoRTCMarks, list[dict[str, object]]]:
    sent: list[dict[str, object]] = []

    def send(payload: bytes, topic: str) -> None:
        assert topic == TOPIC_AGENT
        sent.append(json.loads(payload))

    return AutoRTCMarks(send, lambda: "turn-7"), sent


def test_probe_ready_gets_agent_ready_and_replies_are_numbered_per_case() -> None:
    marks, sent = collect()
    marks.on_state("listening", "speaking")  # the greeting, before any case: no marks
    marks.on_state("speaking", "listening")
    marks.on_data(TOPIC_USER, msg("case_start"))
    assert sent == []
    marks.on_data(TOPIC_PROBE, msg("probe_ready"))
    assert sent == [{"type": "agent_ready", "trace_id": "t1", "case_id": "c1"}]
    for _ in range(2):
        marks.on_state("thinking", "speaking")
        marks.on_state("speaking", "speaking")  # no second start for the same reply
        marks.on_state("speaking", "listening")
    assert [(m["type"], m["reply_seq"], m["agent_trace_id"]) for m in sent[1:]] == [
        ("reply_start", 1, "turn-7"), ("reply_end", 1, "turn-7"),
        ("reply_start", 2, "turn-7"), ("reply_end", 2, "turn-7")]
    marks.on_data(TOPIC_PROBE, msg("probe_ready", "t2", "c2"))  # the next case
    marks.on_state("listening", "speaking")
    assert [(m["type"], m["trace_id"], m["case_id"], m.get("reply_seq")) for m in sent[-2:]] \
        == [("agent_ready", "t2", "c2", None), ("reply_start", "t2", "c2", 1)]


def test_garbage_and_foreign_messages_are_ignored() -> None:
    marks, sent = collect()
    for topic, payload in [
        (TOPIC_PROBE, b"\xff\xfe not utf-8"), (TOPIC_PROBE, b"{not json"),
        (TOPIC_PROBE, b"[1, 2]"), (TOPIC_PROBE, json.dumps({"type": "probe_ready"}).encode()),
        (TOPIC_PROBE, json.dumps({"type": "probe_ready", "trace_id": 1,
                                  "case_id": "c"}).encode()),
        ("latency", msg("probe_ready")), (None, msg("probe_ready")),
        (TOPIC_USER, msg("probe_ready")), (TOPIC_PROBE, msg("case_start")),
        (TOPIC_AGENT, msg("agent_ready")),
    ]:
        marks.on_data(topic, payload)
    marks.on_state("listening", "speaking")
    assert sent == [] and marks.case is None


async def test_a_real_reply_is_marked_start_then_end(tts_server: Server, thinker: Server,
                                                    tmp_path: Path) -> None:
    async with DirectSession(make_settings(tts_server, thinker)) as ds:
        await ds.wait_until_quiet(timeout=60, quiet_s=0.5)  # the greeting: no case yet
        sent: list[tuple[float, dict[str, object]]] = []
        tracker = ds.pipeline.tracker
        marks = AutoRTCMarks(lambda p, _t: sent.append((time.perf_counter(), json.loads(p))),
                             lambda: tracker.current.trace_id if tracker.current else None)
        ds.session.on("agent_state_changed", lambda ev: marks.on_state(ev.old_state,
                                                                        ev.new_state))
        marks.on_data(TOPIC_USER, msg("case_start", "trace-a", "case-a"))
        marks.on_data(TOPIC_PROBE, msg("probe_ready", "trace-a", "case-a"))
        await ds.say_user(espeak("What is the weather like today?", tmp_path))
        await ds.wait_state(DuplexState.SPEAKING, timeout=20)
        await ds.wait_until_quiet(timeout=90)
        turns = [t for t in ds.result().turns if t["kind"] == "user"]
    kinds = [(m["type"], m.get("reply_seq")) for _, m in sent]
    assert kinds == [("agent_ready", None), ("reply_start", 1), ("reply_end", 1)]
    assert all((m["trace_id"], m["case_id"]) == ("trace-a", "case-a") for _, m in sent)
    assert sent[1][1]["agent_trace_id"] == turns[-1]["trace_id"]
    start, end = sent[1][0], sent[2][0]
    audible = [t.at for t in ds.speaker.ticks if t.audible and start - 0.5 <= t.at <= end + 0.5]
    assert end > start and audible, "the marks do not frame the spoken reply"
