"""Function tools are refused clearly: the voice.llm.v1 thinker cannot call them, so the
LLM plugin fails a chat that carries tools (naming them) instead of dropping them."""

from __future__ import annotations

import logging

import pytest
from livekit.agents import APIConnectOptions, APIError, llm
from livekit.agents.llm import ChatContext, function_tool
from livekit.agents.voice import Agent, AgentSession
from voice_agent.plugins import LLM

from .backends import Server

ONCE = APIConnectOptions(max_retry=0, timeout=10)
REFUSAL = ("function tools are not supported by the voice.llm.v1 thinker: "
           "get_weather, set_alarm")


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@function_tool
async def set_alarm(time: str) -> str:
    """Set an alarm."""
    return "set"


def chat() -> ChatContext:
    ctx = ChatContext.empty()
    ctx.add_message(role="user", content="what is the weather in Paris?")
    return ctx


def thinker_calls(thinker: Server) -> float:
    return thinker.metric("llm_requests_total")


async def test_a_chat_with_tools_fails_naming_them(thinker: Server,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    plugin = LLM(addr=thinker.addr, max_tokens=8, seed=1)
    errors: list[llm.LLMError] = []
    plugin.on("error", errors.append)
    calls = thinker_calls(thinker)
    with caplog.at_level(logging.ERROR, logger="voice_agent.llm"):
        for _ in range(2):
            with pytest.raises(APIError, match=REFUSAL):
                async with plugin.chat(chat_ctx=chat(), tools=[set_alarm, get_weather],
                                       conn_options=ONCE) as stream:
                    async for _ in stream:
                        pass
    assert [e.recoverable for e in errors] == [False, False]
    assert [r.getMessage() for r in caplog.records].count(REFUSAL + " (remove them from the "
                                                          "Agent, or use an LLM plugin that "
                                                          "calls tools)") == 1  # logged once
    assert thinker_calls(thinker) == calls  # refused before any call
    # The same plugin without tools answers.
    text = ""
    async with plugin.chat(chat_ctx=chat(), conn_options=ONCE) as stream:
        async for chunk in stream:
            text += chunk.delta.content if chunk.delta and chunk.delta.content else ""
    await plugin.aclose()
    assert text and thinker_calls(thinker) == calls + 1


async def test_an_agent_with_function_tools_gets_the_refusal(thinker: Server) -> None:
    # The framework passes the Agent's @function_tool list to every chat: the session
    # reports the refusal as an LLM error instead of replying without the tools.
    plugin = LLM(addr=thinker.addr, max_tokens=8, seed=1)
    session: AgentSession = AgentSession(llm=plugin)
    errors: list[str] = []
    session.on("error", lambda ev: errors.append(str(getattr(ev.error, "error", ev.error))))
    await session.start(Agent(instructions="Be brief.", tools=[get_weather, set_alarm]),
                        record=False)
    try:
        with pytest.raises(Exception):  # noqa: B017 (the run ends with the framework's error)
            await session.run(user_input="what is the weather in Paris?")
    finally:
        await session.aclose()
        await plugin.aclose()
    assert any(REFUSAL in e for e in errors), errors
