"""The tool-call parser on crafted replies: text around calls stays text, a call split
anywhere across deltas comes out whole, and a block that is no call of a known tool (or
that the reply ends inside) is dropped: it must never reach the TTS."""

from __future__ import annotations

import json

import pytest
from voice_llm.backends.tools import ToolCallParser, chunks_of, finish_reason
from voice_llm.chat import FinishReason, ToolCall

CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
        '\n</tool_call>')
REPLY = "Let me look.\n" + CALL + "\nDone."


def feed_all(pieces: list[str]) -> list[str | ToolCall]:
    p = ToolCallParser(["get_weather", "set_alarm"])
    events = [e for piece in pieces for e in p.feed(piece)] + p.flush()
    merged: list[str | ToolCall] = []
    for e in events:  # adjacent text pieces as one, as a client would read them
        if isinstance(e, str) and merged and isinstance(merged[-1], str):
            merged[-1] += e
        else:
            merged.append(e)
    return merged


def test_text_a_call_text_in_one_piece() -> None:
    text1, call, text2 = feed_all([REPLY])
    assert text1 == "Let me look.\n" and text2 == "Done."
    assert isinstance(call, ToolCall) and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris", "days": [1, 2]}
    assert call.id.startswith("call_")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_a_call_split_across_deltas_comes_out_whole(size: int) -> None:
    pieces = [REPLY[i:i + size] for i in range(0, len(REPLY), size)]
    events = feed_all(pieces)
    assert [type(e) for e in events] == [str, ToolCall, str]
    assert events[0] == "Let me look.\n" and events[2] == "Done."
    assert json.loads(events[1].arguments)["city"] == "Paris"


def test_no_half_tag_is_sent_as_text() -> None:
    p = ToolCallParser(["get_weather"])
    assert p.feed("Hi <tool_") == ["Hi "]  # held back: it may open a call
    assert p.feed("ca") == []
    assert p.feed("rt>") == ["<tool_cart>"]  # it did not


def test_two_calls_and_their_indexes_in_order() -> None:
    other = CALL.replace("get_weather", "set_alarm")
    events = feed_all([CALL + "\n" + other])
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_weather", "set_alarm"]
    assert all(isinstance(e, ToolCall) for e in events)  # the newline between is dropped


@pytest.mark.parametrize("body", [
    '{"name": "launch_rockets", "arguments": {}}',  # not one of the tools
    '{"name": "get_weather", "arguments": [1]}',  # arguments not an object
    '{"name": "get_weather", "arguments": {"city": ',  # not JSON
])
def test_what_is_not_a_known_call_is_dropped(body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    p = ToolCallParser(["get_weather", "set_alarm"])
    out = [e for piece in ("a ", text, " b") for e in p.feed(piece)] + p.flush()
    assert "".join(e for e in out if isinstance(e, str)) == "a b" and p.dropped == 1


def test_a_reply_cut_inside_a_call() -> None:
    whole = '<tool_call>\n{"name": "set_alarm", "arguments": {"time": "7:00"}}'
    [call] = feed_all([whole])  # the JSON is whole: it is the call
    assert isinstance(call, ToolCall) and json.loads(call.arguments) == {"time": "7:00"}
    # cut short (the token limit): no call, and nothing of it is text to be spoken
    assert feed_all([whole[:-5]]) == []
    assert feed_all(["Sure. ", whole[:-5]]) == ["Sure. "]
    assert feed_all(["Sure. <tool_"]) == ["Sure. "]  # ended inside the tag itself


def test_chunks_keep_order_and_the_finish() -> None:
    call = ToolCall("call_1", "get_weather", "{}")
    chunks = chunks_of(["a", call, "b"], 3, 10, FinishReason.STOP)
    assert [(c.text, c.tool_calls, c.new_tokens, c.finish) for c in chunks] == [
        ("a", (call,), 3, None), ("b", (), 0, FinishReason.STOP)]
    assert finish_reason(FinishReason.STOP, 1) is FinishReason.TOOL_CALLS
    assert finish_reason(FinishReason.LENGTH, 1) is FinishReason.LENGTH
    assert finish_reason(FinishReason.STOP, 0) is FinishReason.STOP


def test_a_raw_control_character_goes_out_escaped() -> None:
    [call] = feed_all(['<tool_call>{"name": "set_alarm", "arguments": {"time": "7\x03"}}'
                       '</tool_call>'])
    assert "\x03" not in call.arguments and json.loads(call.arguments) == {"time": "7\x03"}


def test_a_forced_calls_free_strings_are_bounded() -> None:
    from voice_llm.backends.tools import MAX_STRING_ARG_CHARS, bounded_strings

    schema = {"type": "object", "properties": {
        "note": {"type": "string"},  # free: bounded
        "code": {"type": "string", "maxLength": 4},  # its own bound kept
        "mood": {"type": "string", "enum": ["ok", "bad"]},
        "tags": {"type": "array", "items": {"type": ["string", "null"]}},
        "more": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
    out = bounded_strings(schema)["properties"]
    assert out["note"]["maxLength"] == MAX_STRING_ARG_CHARS
    assert out["code"]["maxLength"] == 4 and "maxLength" not in out["mood"]
    assert out["tags"]["items"]["maxLength"] == MAX_STRING_ARG_CHARS
    assert out["more"]["anyOf"][0]["maxLength"] == MAX_STRING_ARG_CHARS
    assert "maxLength" not in out["more"]["anyOf"][1]
    assert "maxLength" not in schema["properties"]["note"]  # the tool's own is untouched
