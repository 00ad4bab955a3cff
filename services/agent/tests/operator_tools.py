"""Tools an operator might register (AGENT_TOOLS=tests.operator_tools:TOOLS in the agent
tests): one that answers, one slow enough for the filler, one that fails, one that hangs."""

from __future__ import annotations

import asyncio
from typing import Literal

from livekit.agents.llm import function_tool

CALLS: list[tuple[str, dict]] = []


@function_tool
async def get_time(city: Literal["Paris", "Oslo"]) -> str:
    """The local time in a city."""
    CALLS.append(("get_time", {"city": city}))
    await asyncio.sleep(1.5)  # slow: the filler is spoken meanwhile
    return f"It is 10:30 in {city}."


@function_tool
async def broken(reason: str) -> str:
    """A tool that always fails."""
    CALLS.append(("broken", {"reason": reason}))
    raise RuntimeError("the backend is down")


@function_tool
async def hangs() -> str:
    """A tool that never answers."""
    CALLS.append(("hangs", {}))
    await asyncio.sleep(3600)
    return "never"


TOOLS = [get_time]
ALL = [get_time, broken, hangs]
