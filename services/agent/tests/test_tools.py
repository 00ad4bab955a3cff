"""Tools the operator registers (AGENT_TOOLS, voice_agent/tools.py): loaded from entry
points with clear errors, run with a timeout and a failure as an error result, the
filler said while a slow one runs; offered to the model on the LiveKit path (the Agent's
tools) and run by the Realtime session itself, whose reply goes on with the result."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from voice_agent.agent import build_pipeline
from voice_agent.settings import AgentSettings
from voice_agent.tools import load_tools, run_tool, schema

from . import operator_tools
from .backends import Server
from .test_realtime import Events
from .test_ws_talk import Agent, serve, settings_for

ENTRY = "tests.operator_tools:TOOLS"


def test_load_tools_names_what_is_wrong() -> None:
    assert [schema(t)["name"] for t in load_tools(ENTRY)] == ["get_time"]
    assert [schema(t)["name"] for t in load_tools("tests.operator_tools:ALL")] == [
        "get_time", "broken", "hangs"]
    assert load_tools("") == []
    for spec, words in (("tests.operator_tools", "is not 'package.module:attr'"),
                        ("no.such.module:X", "No module named"),
                        ("tests.operator_tools:NOPE", "has no attribute"),
                        ("tests.operator_tools:asyncio", "not a livekit-agents @function_tool"),
                        (f"{ENTRY},{ENTRY}", "names a tool twice")):
        with pytest.raises(ValueError, match=words):
            load_tools(spec)
    assert schema(load_tools(ENTRY)[0])["parameters"]["properties"]["city"]["enum"] == [
        "Paris", "Oslo"]


async def test_a_failing_a_hanging_and_a_misused_tool_give_error_results() -> None:
    settings = AgentSettings(tool_timeout_s=0.3, tool_filler="")
    tools = {schema(t)["name"]: t for t in load_tools("tests.operator_tools:ALL")}
    out, err = await run_tool(tools["broken"], '{"reason": "x"}', settings)
    assert err and out == "error: broken failed: RuntimeError: the backend is down"
    out, err = await run_tool(tools["hangs"], "{}", settings)
    assert err and out == "error: hangs did not answer within 0.3 s"
    out, err = await run_tool(tools["get_time"], '{"city": "Rome"}', settings)
    assert err and out.startswith("error:")  # not one of the enum's cities
    said: list[str] = []
    out, err = await run_tool(tools["get_time"], '{"city": "Oslo"}',
                              AgentSettings(tool_filler_after_s=0.2), say=said.append)
    assert (out, err) == ("It is 10:30 in Oslo.", False)
    assert said == ["One moment, please."]  # it ran 1.5 s: the filler was said once


async def test_the_livekit_path_runs_the_operators_tool_and_answers(
        tts_server: Server, thinker: Server) -> None:
    """The AgentSession of the LiveKit worker and /v1/talk (here in direct mode): the
    thinker, made to call (tool_choice required), calls the operator's tool; livekit-agents
    runs it through our wrapper and the reply goes on with the result."""
    from voice_agent.direct import DirectSession

    operator_tools.CALLS.clear()
    settings = settings_for(tts_server, thinker, tools=ENTRY, llm_max_tokens=400,
                            tts_max_frames=12, greeting="", tool_filler="")
    assert [schema(t)["name"] for t in build_pipeline(settings).agent.tools] == ["get_time"]
    async with DirectSession(settings, greet=False) as ds:
        handle = ds.session.generate_reply(user_input="What time is it in Paris?",
                                           tool_choice="required")
        await asyncio.wait_for(handle.wait_for_playout(), 90)
        async with asyncio.timeout(60):  # the follow-up reply with the tool's result
            while not [i for i in ds.session.history.items
                       if i.type == "function_call_output"]:
                await asyncio.sleep(0.1)
        items = ds.session.history.items
    [(name, args)] = operator_tools.CALLS
    assert name == "get_time" and args["city"] in ("Paris", "Oslo")
    [out] = [i for i in items if i.type == "function_call_output"]
    assert out.output == f"It is 10:30 in {args['city']}." and not out.is_error


@pytest.fixture
async def agent(tts_server: Server, thinker: Server) -> AsyncIterator[Agent]:
    # no filler: the reply's TTS stream is still open while the tool runs, and the CPU
    # test TTS takes one stream at a time (as in the LiveKit path's test above)
    a = await serve(settings_for(tts_server, thinker, llm_max_tokens=400, tts_max_frames=30,
                                 starter_cache=False, tools=ENTRY, tool_filler=""))
    yield a
    await a.runner.cleanup()


async def test_the_realtime_session_runs_the_operators_tool_and_goes_on(agent: Agent) -> None:
    operator_tools.CALLS.clear()
    client = openai.AsyncOpenAI(base_url=f"{agent.http}/v1", api_key="none")
    async with client.realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={
            "type": "realtime", "tool_choice": "required",
            "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What time is it in Paris?"}]})
        await conn.response.create()
        first = (await evs.wait("response.done", 1, timeout=90))["response"]
        second = (await evs.wait("response.done", 2, timeout=90))["response"]
        with pytest.raises(TimeoutError):  # the follow-up is no call: nothing more
            await evs.wait("response.done", 3, timeout=1.5)
    calls = [o for o in first["output"] if o["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_time"]
    args = json.loads(calls[0]["arguments"])
    assert [("get_time", args)] == operator_tools.CALLS and args["city"] in ("Paris", "Oslo")
    outputs = [e["item"] for e in evs.of("conversation.item.added")
               if e["item"]["type"] == "function_call_output"]
    assert outputs == [{**outputs[0], "call_id": calls[0]["call_id"],
                        "output": f"It is 10:30 in {args['city']}."}]
    assert first["status"] == second["status"] == "completed"
    assert second["output"][0]["type"] == "message"  # the reply went on
    assert not evs.of("error"), evs.of("error")


async def test_a_client_tool_may_not_take_an_operators_name(agent: Agent) -> None:
    client = openai.AsyncOpenAI(base_url=f"{agent.http}/v1", api_key="none")
    async with client.realtime.connect(model="voice-agent") as conn:
        evs = Events(conn)
        await conn.session.update(session={"type": "realtime", "tools": [
            {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]})
        err: dict[str, Any] = await evs.wait("error", timeout=10)
        assert err["error"]["param"] == "session.tools" and "AGENT_TOOLS" in err["error"]["message"]
        await asyncio.sleep(0)
