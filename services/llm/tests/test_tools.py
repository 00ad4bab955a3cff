"""Function tools through the real server (tiny random model): a forced call (REQUIRED or
a named function) is one call whose arguments validate against the tool's schema, for any
seed; NONE calls nothing and shows the model no tools; a conversation with a call and its
result is answered; bad tool input is INVALID_ARGUMENT naming the problem."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest
from conftest import Thinker, request, text_of, user
from voice.llm.v1 import thinker_pb2 as pb

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
ORDER = {"type": "object",  # nested object, enums, an array, a bounded integer
         "properties": {
             "item": {"type": "object",
                      "properties": {"kind": {"enum": ["tea", "coffee"]},
                                     "size": {"type": "integer", "minimum": 1, "maximum": 3}},
                      "required": ["kind", "size"]},
             "extras": {"type": "array", "items": {"enum": ["milk", "sugar"]}, "maxItems": 2},
             "urgent": {"type": "boolean"}},
         "required": ["item", "extras", "urgent"]}
SCHEMAS = {"get_weather": WEATHER, "order_drink": ORDER}
TOOLS = [pb.Tool(name=n, description=f"{n} tool", parameters_json=json.dumps(s))
         for n, s in SCHEMAS.items()]
REQUIRED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)


def ask(**kw: object) -> pb.ChatRequest:
    base: dict[str, object] = dict(max_tokens=400, temperature=1.0, tools=TOOLS)
    base.update(kw)
    return request(user("What is the weather in Paris? And a tea, please."), **base)


def calls_of(deltas: list[pb.ChatDelta]) -> list[pb.ToolCallDelta]:
    return [c for d in deltas for c in d.tool_calls]


def assert_one_valid_call(deltas: list[pb.ChatDelta], names: set[str]) -> pb.ToolCallDelta:
    [call] = calls_of(deltas)
    assert call.index == 0 and call.id.startswith("call_") and call.name in names
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert text_of(deltas) == ""  # a forced reply is the call only
    assert deltas[-1].final.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert not any(d.text and d.tool_calls for d in deltas)
    return call


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_required_gives_one_schema_valid_call(thinker: Thinker, seed: int) -> None:
    deltas = await thinker.chat(ask(seed=seed, tool_choice=REQUIRED))
    assert_one_valid_call(deltas, set(SCHEMAS))


@pytest.mark.parametrize(("name", "seed"), [("order_drink", 3), ("order_drink", 4),
                                            ("get_weather", 5)])
async def test_a_named_function_is_the_call(thinker: Thinker, name: str, seed: int) -> None:
    deltas = await thinker.chat(ask(seed=seed, tool_choice=pb.ToolChoice(function_name=name)))
    assert assert_one_valid_call(deltas, {name}).name == name


async def test_greedy_required_is_valid_too(thinker: Thinker) -> None:
    deltas = await thinker.chat(ask(temperature=0.0, tool_choice=REQUIRED))
    assert_one_valid_call(deltas, set(SCHEMAS))


async def test_none_calls_nothing_and_shows_no_tools(thinker: Thinker) -> None:
    none = await thinker.chat(ask(seed=1, max_tokens=40,
                                  tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)))
    auto = await thinker.chat(ask(seed=1, max_tokens=1))
    bare = await thinker.chat(ask(seed=1, max_tokens=1, tools=[]))
    assert calls_of(none) == []
    assert none[-1].final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    # NONE renders no tools: the prompt is the bare one; AUTO's carries the tools.
    assert none[-1].final.prompt_tokens == bare[-1].final.prompt_tokens
    assert auto[-1].final.prompt_tokens > bare[-1].final.prompt_tokens + 100


async def test_a_call_and_its_result_are_answered(thinker: Thinker) -> None:
    [call] = calls_of(await thinker.chat(ask(seed=7, tool_choice=pb.ToolChoice(
        function_name="get_weather"))))
    history = [
        user("What is the weather in Paris?"),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(
            id=call.id, name=call.name, arguments_json=call.arguments)]),
        pb.Message(role=pb.ROLE_TOOL, tool_call_id=call.id,
                   parts=[pb.Part(text='{"temperature": 21, "sky": "clear"}')]),
    ]
    deltas = await thinker.chat(request(*history, tools=TOOLS, max_tokens=8, seed=1,
                                        tool_choice=pb.ToolChoice(
                                            mode=pb.TOOL_CHOICE_MODE_NONE)))
    final = deltas[-1].final
    assert final.completion_tokens > 0 and text_of(deltas)
    asked = await thinker.chat(request(history[0], tools=TOOLS, max_tokens=1, tool_choice=(
        pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE))))
    # The call and its result reached the prompt (the template renders both).
    assert final.prompt_tokens > asked[-1].final.prompt_tokens + 30


def _bad(**kw: object) -> pb.ChatRequest:
    return request(user("hi"), **kw)


CALLED = pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(
    id="call_1", name="get_weather", arguments_json='{"city": "Oslo"}')])


@pytest.mark.parametrize(("req", "message"), [
    (_bad(tools=TOOLS, tool_choice=pb.ToolChoice(function_name="fly")),
     "tool_choice.function_name 'fly' is not one of tools"),
    (_bad(tool_choice=REQUIRED), "tool_choice REQUIRED needs tools"),
    (_bad(tools=[TOOLS[0], TOOLS[0]]), "is a duplicate"),
    (_bad(tools=[pb.Tool(name="t", parameters_json="{nope")]), "is not JSON"),
    (_bad(tools=[pb.Tool(name="t", parameters_json='{"type": "object", "properties": '
                                                   '{"a": {"type": "nope"}}}')]),
     "is not a valid JSON Schema"),
    (_bad(tools=[pb.Tool(name="t", parameters_json='{"type": "string"}')]),
     "must be a JSON Schema of an object"),
    (_bad(tools=[pb.Tool(name="get weather")]), "must be 1-64 of"),
    (_bad(tools=[pb.Tool(name=f"t{i}") for i in range(33)]), "33 tools is over the limit"),
    (request(user("hi"), pb.Message(role=pb.ROLE_TOOL, tool_call_id="call_9",
                                    parts=[pb.Part(text="x")])),
     "tool_call_id 'call_9' matches no tool call"),
    (request(user("hi"), CALLED, pb.Message(role=pb.ROLE_TOOL, parts=[pb.Part(text="x")])),
     "a TOOL message needs tool_call_id"),
    (request(user("hi"), CALLED, CALLED), "tool call id 'call_1' is used twice"),
    (request(pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text="hi")],
                        tool_calls=CALLED.tool_calls)),
     "tool_calls are accepted in ASSISTANT messages only"),
    (request(user("hi"), pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(
        id="c", name="get_weather", arguments_json="[1]")])), "must be a JSON object"),
])
async def test_bad_tool_input_is_invalid_argument(thinker: Thinker, req: pb.ChatRequest,
                                                  message: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await thinker.chat(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (e.value.details() or "")
