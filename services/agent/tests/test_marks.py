"""The AutoRTC wire format (voice_agent.marks): the one copy both the agent and AutoRTC
import, so these are the bytes on the data channel."""

from __future__ import annotations

import json

import pytest
from voice_agent import marks


def test_encode_is_compact_json_in_the_documented_order() -> None:
    payload = marks.encode(marks.REPLY_START, "tr", "case", reply_seq=2, agent_trace_id="a1")
    assert payload == (b'{"type":"reply_start","trace_id":"tr","case_id":"case",'
                       b'"reply_seq":2,"agent_trace_id":"a1"}')
    assert marks.decode(payload) == {"type": "reply_start", "trace_id": "tr",
                                     "case_id": "case", "reply_seq": 2, "agent_trace_id": "a1"}


@pytest.mark.parametrize("payload", [b"\xff\xfe", b"{not json", b"[1, 2]", b'"text"'])
def test_garbage_decodes_to_none(payload: bytes) -> None:
    assert marks.decode(payload) is None and marks.decode_case_message(payload) is None


def test_case_message_needs_string_type_and_ids() -> None:
    ok = marks.decode_case_message(marks.encode(marks.PROBE_READY, "t", "c", extra=1))
    assert ok == {"type": "probe_ready", "trace_id": "t", "case_id": "c"}
    for bad in ({"type": "probe_ready", "trace_id": 1, "case_id": "c"},
                {"type": "probe_ready", "case_id": "c"}, {"type": 3, "trace_id": "t",
                                                          "case_id": "c"}):
        assert marks.decode_case_message(json.dumps(bad).encode()) is None


def test_latency_record_keys_and_bytes() -> None:
    assert marks.LATENCY_KEYS == ("trace_id", "eot_to_first_audio_ms", "llm_ttft_ms",
                                  "tts_ttfa_ms")
    rec = {"trace_id": "turn-1", "eot_to_first_audio_ms": 410.5, "llm_ttft_ms": None,
           "tts_ttfa_ms": 80.0}
    assert marks.encode_latency(rec) == json.dumps(rec).encode()
    assert marks.decode(marks.encode_latency(rec)) == rec
