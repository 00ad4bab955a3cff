"""The conversation core's pieces a door that reports items uses, without a socket: what a
door may set (options.py), the items (items.py), the audio in JSON events
(audio_formats.py) and the JSON frames (frames.py)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from voice_agent import audio_formats
from voice_agent.conversation import options
from voice_agent.conversation.frames import read_json, wire_json
from voice_agent.conversation.items import Items, Said, client_item
from voice_agent.conversation.options import ConversationError, Options, TurnDetection

BASE = TurnDetection(threshold=0.5, silence_duration_ms=200)


@contextmanager
def refused(param: str, code: str = "invalid_value") -> Iterator[None]:
    """A ConversationError naming `param` is raised within."""
    with pytest.raises(ConversationError) as e:
        yield
    assert (e.value.param, e.value.code) == (param, code), e.value.message


def test_turn_detection_keeps_unset_values_and_names_a_bad_one() -> None:
    td = options.turn_detection({"type": "semantic_vad", "eagerness": "high"}, BASE, "s.td")
    assert td is not None and (td.type, td.eagerness, td.threshold) == ("semantic_vad", "high", 0.5)
    assert td.as_json()["eagerness"] == "high" and "threshold" not in td.as_json()
    assert options.turn_detection(None, BASE, "s.td") is None  # the client's turns
    for value, param in (({"threshold": 1.5}, "s.td.threshold"),
                         ({"silence_duration_ms": True}, "s.td.silence_duration_ms"),
                         ({"prefix_padding_ms": float("nan")}, "s.td.prefix_padding_ms"),
                         ({"type": "push_to_talk"}, "s.td.type"),
                         ({"eagerness": "eager"}, "s.td.eagerness"), ([], "s.td")):
        with refused(param):
            options.turn_detection(value, BASE, "s.td")


def test_overrides_take_either_name_and_check_tools_against_the_choice() -> None:
    base = Options(instructions="Be brief.", voice="aiden", turn_detection=BASE)
    tool = {"type": "function", "name": "f", "description": "d", "parameters": {}}
    u = options.overrides({"output_modalities": ["text"], "max_response_output_tokens": "inf",
                           "tools": [tool], "tool_choice": {"type": "function", "name": "f"}},
                          base, "response", 100)
    assert u["modalities"] == ("text",) and u["max_output_tokens"] is None
    assert u["tool_choice"] == {"type": "function", "name": "f"}
    assert u["tools"][0]["parameters"] == {"type": "object", "properties": {}}
    assert options.overrides({"instructions": None}, base, "response", 100) == {}
    with refused("response.tool_choice"):  # not among the tools it has
        options.overrides({"tool_choice": {"type": "function", "name": "g"}}, base,
                          "response", 100)
    with refused("response.instructions"):
        options.overrides({"instructions": "x" * 101}, base, "response", 100)
    with refused("response.tools[1].name"):
        options.overrides({"tools": [tool, tool]}, base, "response", 100)
    with refused("response.max_output_tokens"):
        options.overrides({"max_output_tokens": 0}, base, "response", 100)


def message(item_id: str, text: str, role: str = "user") -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": role, "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def test_items_are_placed_bounded_and_made_room_for() -> None:
    limits = [3, 50, 100]
    deleted: list[str] = []
    items = Items(lambda: (limits[0], limits[1], limits[2]), deleted.append)
    assert items.add(message("a", "one"), None) is None
    assert items.add(message("b", "two"), "root") is None  # first
    assert items.add(message("c", "three"), "b") == "b"
    assert [it["id"] for it in items] == ["b", "c", "a"]
    with refused("item.id", "duplicate_item_id"):
        items.add(message("a", "again"), None)
    with refused("item"):  # over one item's characters
        items.add(message("d", "x" * 51), None)
    with refused("item", "conversation_too_large"):  # a fourth
        items.add(message("d", "four"), None)
    items.delete("a")
    with refused("item_id", "item_not_found"):  # after an item it does not hold
        items.add(message("d", "four"), "nowhere")
    assert len(items) == 2 and deleted == []  # `delete` is the client's: said by the door
    limits[0] = 1
    items.make_room()  # the replies' own room: the oldest go, each said
    assert deleted == ["b"] and [it["id"] for it in items] == ["c"]


def test_what_a_reply_said_counts_and_goes_with_its_item() -> None:
    # A reply's text as made is kept beside its message (never shown to a client), counts
    # against the bounds before its transcript is written, and leaves with the item.
    deleted: list[str] = []
    items = Items(lambda: (10, 100, 60), deleted.append)
    items.append(message("r", "", role="assistant"))
    items.said["r"] = Said(text="x" * 50, audio_ms=1000.0)
    with refused("item", "conversation_too_large"):  # 50 made + 20 > 60
        items.add(message("u", "y" * 20), None)
    items.append(message("u", "y" * 20))  # a reply's own: made room for after it
    items.make_room()
    assert deleted == ["r"] and items.said == {}
    items.said["u"] = Said()
    items.delete("u")
    assert items.said == {}


def test_the_items_as_the_thinkers_context() -> None:
    items = Items(lambda: (10, 100, 1000), lambda _: None)
    items.append({"id": "call", "type": "function_call", "call_id": "c1", "name": "look",
                  "arguments": "{}", "status": "completed"})
    items.append({"id": "out", "type": "function_call_output", "call_id": "c1",
                  "output": "sunny", "status": "completed"})
    items.append(message("m", "thanks", role="assistant"))
    ctx = items.chat_ctx("Be brief.")
    kinds = [getattr(i, "type", None) for i in ctx.items]
    assert kinds == ["message", "function_call", "function_call_output", "message"]
    assert ctx.items[2].name == "look"  # the output names its call
    greeted = Items(lambda: (10, 100, 1000), lambda _: None).chat_ctx("Greet.", greeting=True)
    assert [m.role for m in greeted.items] == ["system", "user"]  # a turn to answer


def test_a_clients_item_is_checked_and_its_audio_handed_back() -> None:
    items = Items(lambda: (10, 100, 1000), lambda _: None)

    def decode(b64: Any, param: str) -> np.ndarray:
        return audio_formats.decode(b64, "pcm16", param, 10**6)

    with refused("item.call_id"):  # answers no call of the conversation
        client_item({"type": "function_call_output", "call_id": "c9", "output": "x"},
                    decode, 24000, items)
    with refused("item.content[0].audio"):
        client_item({"type": "message", "role": "user",
                     "content": [{"type": "input_audio", "audio": "not base64!"}]},
                    decode, 24000, items)
    pcm = base64.b64encode(np.zeros(2400, dtype=np.int16).tobytes()).decode()
    item, audio = client_item({"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": pcm}]}, decode, 24000, items)
    # the ear's frames (16 kHz); the resampler keeps a few ms of a clip this short
    assert audio and audio[0].sample_rate == 16000 and sum(f.duration for f in audio) > 0.05
    assert item["content"] == [{"type": "input_audio", "transcript": None}]
    item, audio = client_item({"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": pcm, "transcript": "hi"}]}, decode, 24000, items)
    assert audio is None  # its transcript is given: nothing to hear


def test_audio_formats_by_name_or_mime_and_g711_round_trip() -> None:
    assert audio_formats.parse({"type": "audio/pcmu"}, "f") == "g711_ulaw"
    assert audio_formats.parse("g711_alaw", "f") == "g711_alaw"
    with refused("f.rate"):
        audio_formats.parse({"type": "audio/pcm", "rate": 16000}, "f")
    with refused("a"):  # half a sample
        audio_formats.decode(base64.b64encode(b"\0\0\0").decode(), "pcm16", "a", 100)
    tone = (8000 * np.sin(np.arange(2400) / 24000 * 2 * np.pi * 300)).astype(np.int16)
    for fmt in ("g711_ulaw", "g711_alaw"):
        back = audio_formats.decode(audio_formats.encode(tone.tobytes(), fmt), fmt, "a", 10**6)
        assert len(back) == 800  # 8 kHz
        mean = tone.reshape(-1, 3).mean(axis=1)  # each three samples, as to_8k takes them
        assert np.abs(back - mean).max() < 300  # companded: a step of 256 at this level


def test_json_frames_refuse_what_json_is_not() -> None:
    for bad in ('{"x": NaN}', "[1]", "[" * 3000 + "]" * 3000, "nope"):
        with pytest.raises(ValueError):
            read_json(bad)
    assert read_json('{"type": "x"}') == {"type": "x"}
    assert wire_json({"t": "\ud800"}).isascii()  # a lone surrogate goes escaped
