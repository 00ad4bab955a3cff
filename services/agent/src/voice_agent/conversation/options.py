"""What a door may set on its conversation, checked (a `ConversationError` names the bad
value and changes nothing): the reply's modalities, token limit and temperature, the
tools (the agent's own, AGENT_TOOLS, and a client's, which the client runs) and tool
choice, and how a user turn ends (`TurnDetection`). The door says where in its wire a
value sits (`param`); applying them is the conversation's (core.py `configure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from livekit.agents import llm
from livekit.agents.llm import StopResponse

from .turn_end import EAGERNESS


class ConversationError(Exception):
    """A door's request refused: `code`, the message, the `param` at fault; `type_`:
    invalid_request_error (the client's), server_error (ours)."""

    def __init__(self, code: str, message: str, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.type = code, message, param, type_


def invalid(message: str, param: str) -> ConversationError:
    return ConversationError("invalid_value", message, param)


def shown(value: Any) -> str:
    """A client's value quoted in an error message, cut short."""
    return repr(value)[:80]


def finite_number(v: Any) -> bool:
    """A JSON number the session can use: not a bool, not NaN or infinite."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TurnDetection:
    """How a user turn ends when the conversation hears it (None: the client commits its
    turns). `server_vad` and `semantic_vad` both end it by the one end-of-turn policy
    (turn_end.py); eagerness scales its waits, threshold and silence tune the VAD."""
    threshold: float
    silence_duration_ms: int
    prefix_padding_ms: int = 300
    create_response: bool = True
    interrupt_response: bool = True
    type: str = "server_vad"
    eagerness: str = "auto"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "semantic_vad":
            out["eagerness"] = self.eagerness
        else:
            out.update(threshold=self.threshold, silence_duration_ms=self.silence_duration_ms,
                       prefix_padding_ms=self.prefix_padding_ms)
        return {**out, "create_response": self.create_response,
                "interrupt_response": self.interrupt_response}


@dataclass
class Options:
    """What a door may set on its conversation (core.py `configure` applies them)."""
    instructions: str
    voice: str
    turn_detection: TurnDetection | None
    modalities: tuple[str, ...] = ("audio",)  # ("text",): replies in words only
    tools: list[dict[str, Any]] = field(default_factory=list)  # the client's: it runs them
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None
    max_output_tokens: int | None = None  # None: the agent's AGENT_LLM_MAX_TOKENS


_TURN_FIELDS = (("threshold", float, 1.0), ("silence_duration_ms", int, 10_000),
                ("prefix_padding_ms", int, 10_000), ("create_response", bool, None),
                ("interrupt_response", bool, None))


def turn_detection(value: Any, base: TurnDetection, param: str) -> TurnDetection | None:
    """`value` (an object, or None: the client's turns) over `base`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("turn_detection must be an object or null", param)
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise invalid(f"turn_detection.type must be server_vad or semantic_vad, not "
                      f"{kind!r}", f"{param}.type")
    updates: dict[str, Any] = {"type": kind}
    if value.get("eagerness") is not None:
        if not isinstance(value["eagerness"], str) or value["eagerness"] not in EAGERNESS:
            raise invalid(f"turn_detection.eagerness must be one of {sorted(EAGERNESS)}, "
                          f"not {shown(value['eagerness'])}", f"{param}.eagerness")
        updates["eagerness"] = value["eagerness"]
    for key, kind_, top in _TURN_FIELDS:
        if value.get(key) is None:
            continue
        v = value[key]
        if not (isinstance(v, bool) if kind_ is bool else finite_number(v)):
            raise invalid(f"turn_detection.{key} must be a {kind_.__name__}",
                          f"{param}.{key}")
        if top is not None and not 0 <= v <= top:
            raise invalid(f"turn_detection.{key} must be in [0, {top:g}]", f"{param}.{key}")
        updates[key] = kind_(v)
    return replace(base, **updates)


def check_tools(tools: Any, param: str) -> list[dict[str, Any]]:
    """Function tools a client runs, each {"type": "function", "name", "description",
    "parameters"}, names unique."""
    if not isinstance(tools, list):
        raise invalid("tools must be a list", param)
    names: set[str] = set()
    for i, t in enumerate(tools):
        at = f"{param}[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise invalid('only function tools are supported ({"type": "function", "name", '
                          '"description", "parameters"})', at)
        name = t.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise invalid("each tool needs a unique name", f"{at}.name")
        if not isinstance(t.get("description", ""), str):
            raise invalid("a tool's description must be a string", f"{at}.description")
        if not isinstance(t.get("parameters", {}), dict):
            raise invalid("a tool's parameters must be a JSON Schema object", f"{at}.parameters")
        names.add(name)
    return [{"type": "function", "name": t["name"], "description": t.get("description", ""),
             "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
            for t in tools]


def check_tool_choice(choice: Any, tools: list[dict[str, Any]],
                      param: str) -> str | dict[str, Any]:
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        # {"type": "function", "name"}; Chat Completions' shape: {"function": {"name"}}
        fn = choice.get("function")
        name = choice.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
        if not isinstance(name, str) or name not in {t["name"] for t in tools}:
            raise invalid(f"tool_choice names {shown(name)}, which is not among the "
                          "session's tools", param)
        return {"type": "function", "name": name}
    raise invalid('tool_choice must be "auto", "none", "required" or {"type": "function", '
                  '"name": ...}', param)


def llm_tool_choice(choice: str | dict[str, Any]) -> llm.ToolChoice:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice  # type: ignore[return-value]


def client_tool(t: dict[str, Any]) -> llm.Tool:
    """A tool the client runs: its call ends the reply (the client answers it with the
    call's output and asks for the next)."""
    async def run(raw_arguments: dict[str, object]) -> None:
        raise StopResponse()

    return llm.function_tool(run, raw_schema={"name": t["name"], "description":
                                              t["description"], "parameters": t["parameters"]})


def check_modalities(mods: Any, param: str) -> tuple[str, ...]:
    """["audio"] (a transcript comes with it), ["text"], or both (= audio)."""
    if not isinstance(mods, list) or not mods or \
            not all(isinstance(m, str) and m in ("text", "audio") for m in mods):
        raise invalid(f'{param} must be ["audio"] or ["text"]', param)
    return ("audio",) if "audio" in mods else ("text",)


def max_tokens(value: Any, param: str) -> int | None:
    """A reply's token limit; None ("inf"): the agent's AGENT_LLM_MAX_TOKENS."""
    if value in (None, "inf"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise invalid(f'{param} must be 1..4096 or "inf"', param)
    return value


def temperature(value: Any, param: str) -> float:
    if not finite_number(value) or not 0.0 <= value <= 2.0:
        raise invalid("temperature must be in [0, 2]", param)
    return float(value)


def text(value: Any, limit: int, param: str, name: str = "instructions") -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise invalid(f"{name} must be a string of at most {limit:,} characters", param)
    return value


def overrides(values: dict[str, Any], base: Options, where: str,
              instructions_limit: int) -> dict[str, Any]:
    """What `values` sets of the options, checked, by OpenAI's names for them
    (`output_modalities` or `modalities`, `max_output_tokens` or
    `max_response_output_tokens`); `where`: their place in the door's wire ("session")."""
    u: dict[str, Any] = {}
    if values.get("instructions") is not None:
        u["instructions"] = text(values["instructions"], instructions_limit,
                                 f"{where}.instructions")
    for key in ("output_modalities", "modalities"):
        if values.get(key) is not None:
            u["modalities"] = check_modalities(values[key], f"{where}.{key}")
    if "tools" in values:
        u["tools"] = check_tools(values["tools"], f"{where}.tools")
    if "tool_choice" in values:
        u["tool_choice"] = check_tool_choice(values["tool_choice"], u.get("tools", base.tools),
                                             f"{where}.tool_choice")
    if values.get("temperature") is not None:
        u["temperature"] = temperature(values["temperature"], f"{where}.temperature")
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in values:
            u["max_output_tokens"] = max_tokens(values[key], f"{where}.{key}")
    return u
