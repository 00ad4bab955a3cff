"""Function tools the operator registers (AGENT_TOOLS): loaded once from their entry
points, each run with a timeout (AGENT_TOOL_TIMEOUT_S) and a failure turned into an
error result the model reads (it can apologise or retry), never into a dead turn.

The same tools serve every path: livekit-agents runs them on the LiveKit and /v1/talk
paths (`livekit_tools`: each wrapped so the timeout, the error result and the spoken
filler hold there too), the Realtime session runs them itself (`run_tool`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

from livekit.agents import RunContext, llm
from livekit.agents.llm import ToolError, function_tool
from livekit.agents.llm.tool_context import is_function_tool, is_raw_function_tool
from livekit.agents.llm.utils import build_legacy_openai_schema, prepare_function_arguments

from .settings import AgentSettings

log = logging.getLogger("voice_agent.tools")

Tool = llm.FunctionTool | llm.RawFunctionTool

def load_tools(spec: str) -> list[Tool]:
    """AGENT_TOOLS's entry points -> their function tools; a clear error names what is
    wrong (an import that fails, an attribute that is no tool)."""
    tools: list[Tool] = []
    for entry in filter(None, (x.strip() for x in spec.split(","))):
        module, _, attr = entry.partition(":")
        if not module or not attr:
            raise ValueError(f"AGENT_TOOLS entry {entry!r} is not 'package.module:attr'")
        try:
            value = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"AGENT_TOOLS entry {entry!r}: {e}") from e
        found = value if isinstance(value, list | tuple) else [value]
        for t in found:
            if not (is_function_tool(t) or is_raw_function_tool(t)):
                raise ValueError(f"AGENT_TOOLS entry {entry!r} holds {t!r}, not a "
                                 "livekit-agents @function_tool")
        tools += found
    names = [schema(t)["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"AGENT_TOOLS names a tool twice: {names}")
    return tools

def schema(tool: Tool) -> dict[str, Any]:
    """{"name", "description", "parameters"}: the tool as the model sees it."""
    if is_raw_function_tool(tool):
        raw = tool.info.raw_schema
        return {"name": raw["name"], "description": raw.get("description", ""),
                "parameters": raw.get("parameters") or {"type": "object", "properties": {}}}
    fn = build_legacy_openai_schema(tool)["function"]
    return {"name": fn["name"], "description": fn.get("description", ""),
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}}}

async def run_tool(tool: Tool, arguments: str | dict[str, Any], settings: AgentSettings,
                   say: Callable[[str], Any] | None = None,
                   call_ctx: RunContext[Any] | None = None) -> tuple[str, bool]:
    """(output, is_error): the tool's result as text, or why it failed. `say` speaks the
    filler if the tool is still running after AGENT_TOOL_FILLER_AFTER_S."""
    name = schema(tool)["name"]
    try:
        args, kwargs = prepare_function_arguments(fnc=tool, json_arguments=arguments,
                                                  call_ctx=call_ctx)
    except ToolError as e:
        return f"error: {e.message}", True
    except Exception as e:  # arguments that do not fit the function
        return f"error: bad arguments for {name}: {e}", True
    task: asyncio.Task[Any] = asyncio.ensure_future(_call(tool, args, kwargs))
    filler = None
    if say is not None and settings.tool_filler:
        filler = asyncio.get_running_loop().call_later(settings.tool_filler_after_s,
                                                       lambda: task.done() or
                                                       say(settings.tool_filler))
    try:
        result = await asyncio.wait_for(task, settings.tool_timeout_s)
    except TimeoutError:
        log.warning("tool %s: no result in %.1f s (AGENT_TOOL_TIMEOUT_S)", name,
                    settings.tool_timeout_s)
        return f"error: {name} did not answer within {settings.tool_timeout_s:g} s", True
    except ToolError as e:
        return f"error: {e.message}", True
    except Exception as e:
        log.exception("tool %s failed", name)
        return f"error: {name} failed: {type(e).__name__}: {e}"[:1000], True
    finally:
        if filler is not None:
            filler.cancel()
    if result is None:
        return "done", False
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False

async def _call(tool: Tool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = tool(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out

def livekit_tools(settings: AgentSettings) -> list[Tool]:
    """AGENT_TOOLS for an Agent: each wrapped so livekit-agents runs it with the timeout,
    the spoken filler, and a failure as an error result (ToolError) the model reads."""
    return [_wrapped(t, settings) for t in load_tools(settings.tools)]

def _wrapped(tool: Tool, settings: AgentSettings) -> Tool:
    async def call(raw_arguments: dict[str, object], context: RunContext) -> str:
        output, is_error = await run_tool(tool, raw_arguments, settings,
                                          say=lambda text: context.session.say(text),
                                          call_ctx=context)
        if is_error:
            raise ToolError(output)
        return output

    return function_tool(call, raw_schema=schema(tool))
