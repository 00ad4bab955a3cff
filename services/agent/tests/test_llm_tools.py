"""Function tools through the LLM plugin against the real tiny thinker: an Agent's
@function_tool goes out with its JSON Schema, a forced call (tool_choice required or a
named function) comes back as one whole FunctionToolCall whose arguments validate against
the tool's own argument model, and a chat context holding a call and its output is sent
as the thinker's ToolCall + ROLE_TOOL messages and answered."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from livekit.agents import APIConnectOptions, llm
from livekit.agents.llm import ChatContext, FunctionCall, FunctionCallOutput, function_tool
from livekit.agents.llm.utils import function_arguments_to_pydantic_model
from voice.llm.v1 import thinker_pb2
from voice_agent.plugins import LLM

from .backends import Server

ONCE = APIConnectOptions(max_retry=0, timeout=60)


@function_tool
async def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The weather in a city."""
    return "sunny"


@function_tool
async def order_drink(kind: Literal["tea", "coffee"], sugar: bool, extras: list[str]) -> str:
    """Order a drink."""
    return "ordered"


TOOLS = {"get_weather": get_weather, "order_drink": order_drink}


def ask() -> ChatContext:
    ctx = ChatContext.empty()
    ctx.add_message(role="user", content="what is the weather in Paris? and a tea")
    return ctx


async def run(plugin: LLM, ctx: ChatContext, **kw: object) -> tuple[str, list]:
    text, calls = "", []
    async with plugin.chat(chat_ctx=ctx, conn_options=ONCE, **kw) as stream:  # type: ignore[arg-type]
        async for chunk in stream:
            if chunk.delta is not None:
                text += chunk.delta.content or ""
                calls += chunk.delta.tool_calls
    return text, calls


@pytest.mark.parametrize(("choice", "names"), [
    ("required", set(TOOLS)),
    ({"type": "function", "function": {"name": "order_drink"}}, {"order_drink"}),
])
async def test_a_forced_call_comes_back_whole_and_valid(thinker: Server, choice: object,
                                                       names: set[str]) -> None:
    plugin = LLM(addr=thinker.addr, max_tokens=400, temperature=1.0, seed=3)
    text, calls = await run(plugin, ask(), tools=list(TOOLS.values()), tool_choice=choice)
    await plugin.aclose()
    [call] = calls
    assert isinstance(call, llm.FunctionToolCall) and call.name in names
    assert call.call_id.startswith("call_") and text == ""
    model = function_arguments_to_pydantic_model(TOOLS[call.name])
    model.model_validate(json.loads(call.arguments))  # raises if the arguments do not fit
    req = plugin.last_request
    assert req is not None and {t.name for t in req.tools} == set(TOOLS)
    schema = json.loads(next(t for t in req.tools if t.name == "get_weather").parameters_json)
    assert schema["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]


async def test_a_call_and_its_output_are_sent_and_answered(thinker: Server) -> None:
    ctx = ask()
    ctx.items.append(FunctionCall(call_id="call_7", name="get_weather",
                                  arguments='{"city": "Paris", "unit": "celsius"}'))
    ctx.items.append(FunctionCallOutput(call_id="call_7", name="get_weather",
                                        output="sunny, 21 C", is_error=False))
    ctx.items.append(FunctionCallOutput(call_id="call_gone", output="x", is_error=False))
    plugin = LLM(addr=thinker.addr, max_tokens=8, seed=1)
    text, calls = await run(plugin, ctx, tools=list(TOOLS.values()), tool_choice="none")
    await plugin.aclose()
    assert text and calls == []
    req = plugin.last_request
    assert req is not None
    assert req.tool_choice.mode == thinker_pb2.TOOL_CHOICE_MODE_NONE
    roles = [m.role for m in req.messages]
    assert roles == [thinker_pb2.ROLE_USER, thinker_pb2.ROLE_ASSISTANT, thinker_pb2.ROLE_TOOL]
    [sent] = req.messages[1].tool_calls
    assert (sent.id, sent.name) == ("call_7", "get_weather")
    assert req.messages[2].tool_call_id == "call_7"  # the orphan result was not sent
    assert req.messages[2].parts[0].text == "sunny, 21 C"


async def test_the_next_calls_take_the_options_set_between_them(thinker: Server) -> None:
    """update_options (a Realtime session's settings, or its next response's): the calls
    made after it take them; no per-call options."""
    plugin = LLM(addr=thinker.addr, max_tokens=400, temperature=1.0, seed=3)
    try:
        await run(plugin, ask())
        req = plugin.last_request
        assert req is not None and req.max_tokens == 400 and req.temperature == 1.0
        plugin.update_options(max_tokens=3, temperature=0.0)
        await run(plugin, ask())
        req = plugin.last_request
        assert req is not None and req.max_tokens == 3 and req.temperature == 0.0
        plugin.update_options(max_tokens=400)
        await run(plugin, ask())
        assert plugin.last_request.max_tokens == 400 and plugin.last_request.temperature == 0.0
        with pytest.raises(ValueError, match="update_options"):
            plugin.chat(chat_ctx=ask(), extra_kwargs={"max_tokens": 5})
    finally:
        await plugin.aclose()
