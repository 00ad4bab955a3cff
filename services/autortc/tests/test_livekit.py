"""The livekit transport's pure parts: protocol, reply slicing, tokens, capture status.

FAKE BOUNDARY: there is no LiveKit server here (no server binary installs on these
machines), so the rooms are not joined; the probe's recording is built by hand in the
shape the SDK's AudioStream delivers (10 ms frames at 48 kHz with arrival times).
"""

from __future__ import annotations

import jwt
import numpy as np
import pytest
from voice_agent.marks import decode, encode
from voice_autortc.probe_bot import ProbeBot, Recording, ReplyMarks, slice_reply
from voice_autortc.settings import AutoRTCSettings
from voice_autortc.transports.base import NO_REPLY, OK, POST_SILENT, PRE_MISSING, Capture
from voice_autortc.transports.livekit import finish, room_name
from voice_autortc.user_bot import mint_token

RATE = 48000
FS = RATE // 100


def _recording(segments: list[tuple[float, float, float]], total_s: float = 6.0) -> Recording:
    """10 ms frames from t=0; audible (level) between start and end of each segment."""
    rng = np.random.default_rng(0)
    rec = Recording(rate=RATE)
    for i in range(int(total_s * 100)):
        t = i / 100
        level = next((lv for a, b, lv in segments if a <= t < b), 0.0)
        rec.add((rng.standard_normal(FS) * level).astype(np.float32), t)
    return rec


def test_protocol_round_trip_and_garbage() -> None:
    msg = decode(encode("reply_start", "tr", "case", reply_seq=0))
    assert msg == {"type": "reply_start", "trace_id": "tr", "case_id": "case", "reply_seq": 0}
    assert decode(b"\xff\xfe") is None and decode(b"[1, 2]") is None


def test_marks_match_trace_case_and_seq() -> None:
    m = ReplyMarks("tr", "case")
    assert not m.add({"type": "reply_start", "trace_id": None, "case_id": "case",
                      "reply_seq": 0}, 1.0)  # stale agent (seed 003 13.1)
    assert not m.add({"type": "reply_end", "trace_id": "tr", "case_id": "other",
                      "reply_seq": 0}, 1.5)
    assert m.add({"type": "reply_start", "trace_id": "tr", "case_id": "case",
                  "reply_seq": 3, "agent_trace_id": "ag1"}, 2.0)
    assert m.first_reply() is None  # no end yet
    m.add({"type": "reply_end", "trace_id": "tr", "case_id": "case", "reply_seq": 3}, 4.0)
    assert m.first_reply() == (2.0, 4.0) and m.first_reply(after=2.5) is None
    assert m.ignored == 2 and m.agent_trace_ids == ["ag1"]


def test_slice_by_marks_excludes_greeting() -> None:
    rec = _recording([(0.2, 1.0, 0.1), (2.5, 4.0, 0.1)])  # greeting, then the reply
    marks = ReplyMarks("tr", "c")
    marks.add({"type": "reply_start", "trace_id": "tr", "case_id": "c", "reply_seq": 1}, 2.5)
    marks.add({"type": "reply_end", "trace_id": "tr", "case_id": "c", "reply_seq": 1}, 4.0)
    reply, how, start, end = slice_reply(rec, marks, eot=2.0)
    assert how == "events" and (start, end) == (2.5, 4.0)
    assert reply is not None and len(reply.audio) == 151 * FS


def test_slice_by_energy_without_marks() -> None:
    rec = _recording([(0.2, 1.0, 0.1), (2.5, 3.2, 0.1), (3.5, 4.0, 0.1), (5.5, 5.8, 0.1)])
    _, how, start, end = slice_reply(rec, None, eot=2.0, end_silence_s=1.0)
    assert how == "energy" and start == pytest.approx(2.5)
    assert end == pytest.approx(3.99)  # the 300 ms pause stays in, the 1.5 s one ends it
    assert slice_reply(_recording([]), None, eot=0.0)[0] is None


def test_finish_classifies_capture(tmp_path) -> None:
    s = AutoRTCSettings(pre_rtc_dir=str(tmp_path))
    probe = ProbeBot("tr", "c", "user")
    probe.rec = _recording([(2.5, 4.0, 0.1)])
    probe.latency = [{"trace_id": "agent-turn-1", "eot_to_first_audio_ms": 420.0}]
    cap = finish(Capture(case_id="c", trace_id="tr", eot=2.0), probe, s)
    assert cap.status == PRE_MISSING and cap.first_audible == pytest.approx(2.5)
    from voice_autortc.audio import write_wav

    write_wav(tmp_path / "agent-turn-1" / "pre_rtc.wav", probe.rec.audio()[:RATE], RATE)
    cap = finish(Capture(case_id="c", trace_id="tr", eot=2.0), probe, s)
    assert cap.status == OK and cap.pre is not None
    # Marks say the agent replied, but what arrived is inaudible: the transport's fault.
    probe.rec = _recording([(2.5, 4.0, 0.001)])
    for kind, t in (("reply_start", 2.5), ("reply_end", 4.0)):
        probe.marks.add({"type": kind, "trace_id": "tr", "case_id": "c", "reply_seq": 0}, t)
    assert finish(Capture(case_id="c", trace_id="tr", eot=2.0), probe, s).status == POST_SILENT
    probe.rec, probe.marks = _recording([]), ReplyMarks("tr", "c")
    assert finish(Capture(case_id="c", trace_id="tr", eot=2.0), probe, s).status == NO_REPLY


def test_token_and_room_name() -> None:
    tok = mint_token("key", "secret-secret-secret-secret-1234", room="autortc-x-abc123",
                     identity="probe-bot-1")
    claims = jwt.decode(tok, "secret-secret-secret-secret-1234", algorithms=["HS256"])
    assert claims["sub"] == "probe-bot-1" and claims["video"]["room"] == "autortc-x-abc123"
    assert claims["video"]["roomJoin"] is True
    assert room_name("autortc", "case_a", "0123456789abcdef") == "autortc-case_a-abcdef"


def test_unreachable_server_is_an_error_capture(tmp_path, monkeypatch) -> None:
    # The real SDK against a port nobody listens on: the case is an ERROR capture with the
    # SDK's reason, and the suite still writes its report (exit 1, not a crash).
    import json

    from voice_autortc.run_suite import main

    monkeypatch.setenv("LIVEKIT_URL", "ws://127.0.0.1:9")
    monkeypatch.setenv("LIVEKIT_API_KEY", "key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "secret-secret-secret-secret-1234")
    rc = main(["--transport", "livekit", "--case", "endpoint_short_hello", "--retries", "0",
               "--output-root", str(tmp_path), "--run-id", "lk", "--no-progress"])
    assert rc == 1
    rep = json.loads((tmp_path / "lk" / "report.json").read_text())
    case = rep["cases"][0]
    assert case["capture_status"] == "ERROR" and "Connect" in case["error"]
    assert "> error: ConnectError" in (tmp_path / "lk" / "report.md").read_text()
