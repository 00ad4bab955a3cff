"""Function tools for every backend: the chat template's view of them, the parser that
finds calls in the streamed reply, and the grammar that forces one.

The wire format is Qwen's (Hermes-style), which Qwen2.5/Qwen3/Qwen3-Omni chat templates
teach the model and tiny_random's template renders the same way:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolCallParser` turns the reply's text into text pieces and whole `ToolCall`s as it
streams (auto mode: a call the model wrote is parsed; a `<tool_call>` block that does not
parse as a call of a known tool, or that the reply ends inside, is dropped: it is markup,
and read aloud it was seconds of JSON spoken as the agent's words). For REQUIRED and a
named function, `call_grammar` is the reply's grammar (xgrammar: the tag, then JSON valid
against the tool's schema with its free strings bounded, then the closing tag), so the
call is well formed whatever the weights: the transformers backend masks logits with it
(`Grammars`), vLLM takes the same grammar as EBNF text (structured outputs).
This module knows no engine and no gRPC.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from voice_llm.chat import ChatJob, Chunk, FinishReason, ToolCall, ToolSpec
from voice_llm.errors import InvalidInput

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def template_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]] | None:
    """Tools in the shape HF chat templates take (`apply_chat_template(tools=...)`)."""
    if not tools:
        return None
    return [{"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools]


def template_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """An assistant message's calls for the chat template: arguments as a dict (Qwen's
    template writes a string as is and a mapping as JSON; others expect the mapping)."""
    return [{"type": "function", "id": c.id, "function": {
        "name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason(reason: FinishReason, calls: int) -> FinishReason:
    """A reply that called tools and then ended its turn finished for TOOL_CALLS."""
    return FinishReason.TOOL_CALLS if calls and reason is FinishReason.STOP else reason


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """Streamed reply text -> text pieces and whole tool calls, in order.

    Text that could be the start of `<tool_call>` is held back until the next piece
    decides it; a call is emitted when its `</tool_call>` arrives (or at `flush`, if the
    reply ended inside a call whose JSON is already whole). Whitespace right after a
    call (the newline between calls) is dropped, and so is a block that is no call
    (`dropped` counts them).
    """

    def __init__(self, names: Collection[str]) -> None:
        self._names = set(names)
        self._buf = ""
        self._in_call = False
        self._after_call = False
        self.calls = 0  # calls emitted so far
        self.dropped = 0  # <tool_call> blocks that were no call of a known tool

    def feed(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while True:
            if not self._in_call:
                if self._after_call:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        break
                    self._after_call = False
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = _partial_suffix(self._buf, OPEN)
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(OPEN):]
                self._in_call = True
            else:
                j = self._buf.find(CLOSE)
                if j < 0:
                    break
                body, self._buf = self._buf[:j], self._buf[j + len(CLOSE):]
                self._in_call = False
                out.append(self._call(body))
        return _merged(out)

    def flush(self) -> list[str | ToolCall]:
        buf, self._buf = self._buf, ""
        if not self._in_call:  # what was held back: the start of a tag the reply ended in
            if buf.strip():
                self.dropped += 1
            return []
        self._in_call = False
        call = self._parse(buf)
        if call is None:  # the reply ended inside a call (its token limit): no call, no text
            self.dropped += 1
            return []
        self.calls += 1
        self._after_call = True
        return [call]

    def _call(self, body: str) -> str | ToolCall:
        call = self._parse(body)
        if call is None:  # not a call of a known tool: dropped, never spoken
            self.dropped += 1
            self._after_call = True
            return ""
        self.calls += 1
        self._after_call = True
        return call

    def _parse(self, body: str) -> ToolCall | None:
        # strict=False: a raw control character in a string is taken (xgrammar 0.2.8 lets
        # one into a string with maxLength); the arguments go out re-encoded, valid JSON.
        try:
            obj = json.loads(body, strict=False)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self._names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args, strict=False)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


def _merged(events: list[str | ToolCall]) -> list[str | ToolCall]:
    out: list[str | ToolCall] = []
    for e in events:
        if isinstance(e, str):
            if not e:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += e
                continue
        out.append(e)
    return out


# A free string argument of a forced call is bounded: a model that never closes the
# string (random weights did, for 400 tokens) still makes a call that parses.
MAX_STRING_ARG_CHARS = 256


def bounded_strings(schema: Any) -> Any:
    """`schema` with a maxLength on every string that has no bound of its own."""
    if isinstance(schema, list):
        return [bounded_strings(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: bounded_strings(sub) for name, sub in value.items()}
        else:
            out[key] = bounded_strings(value) if key in _SUBSCHEMAS else value
    types = schema.get("type")
    if (types == "string" or (isinstance(types, list) and "string" in types)) \
            and not _BOUNDS.intersection(schema):
        out["maxLength"] = MAX_STRING_ARG_CHARS
    return out


_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions"}  # name -> schema
_SUBSCHEMAS = {"items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties"}
_BOUNDS = {"maxLength", "enum", "const", "pattern", "format"}


def call_schema(job: ChatJob) -> dict[str, Any]:
    """The JSON Schema of the one call a constrained reply makes: {"name": <a tool>,
    "arguments": <that tool's parameters>, strings bounded} (anyOf the tools for
    REQUIRED)."""
    choice = job.tool_choice
    tools = [t for t in job.tools if choice.function in (None, t.name)]
    alts = [{"type": "object",
             "properties": {"name": {"const": t.name},
                            "arguments": bounded_strings(t.parameters)},
             "required": ["name", "arguments"]} for t in tools]
    assert alts, "protocol.to_job checks that a constrained choice has its tool"
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def call_grammar(job: ChatJob) -> Any:
    """`<tool_call>\\n` + the call's JSON (no free whitespace: a random model would spend
    its tokens on it) + `\\n</tool_call>`, as an xgrammar Grammar."""
    import xgrammar as xgr

    try:
        return xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f'root ::= "{OPEN}\\n"'),
            xgr.Grammar.from_json_schema(json.dumps(call_schema(job)), any_whitespace=False),
            xgr.Grammar.from_ebnf(f'root ::= "\\n{CLOSE}"'))
    except Exception as e:  # xgrammar raises RuntimeError and ValueError kinds
        raise InvalidInput(f"a tool's parameters_json cannot be used for a constrained "
                           f"call ({str(e)[:300]})") from None


def call_ebnf(job: ChatJob) -> str:
    """The same grammar as EBNF text (vLLM's StructuredOutputsParams(grammar=...))."""
    return str(call_grammar(job))


class Grammars:
    """Compiles call grammars against one tokenizer (xgrammar), for logit masking."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Collection[int]) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_ids))
        self._compiler = xgr.GrammarCompiler(info)
        self._vocab = vocab_size

    def constraint(self, job: ChatJob) -> Constraint:
        """A fresh matcher for one reply (compiling takes ms to 100s of ms: off the loop)."""
        import xgrammar as xgr

        compiled = self._compiler.compile_grammar(call_grammar(job))
        return Constraint(xgr.GrammarMatcher(compiled), self._vocab)


class Constraint:
    """One reply's grammar state: the mask of its next tokens, then the picked token.
    Used from the batcher's thread only."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._matcher = matcher
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # (1, ceil(V / 32)) int32

    def allowed(self, vocab_size: int, device: Any) -> Any:
        """A bool mask (V,) of the tokens the grammar takes next."""
        import torch
        import xgrammar as xgr

        self._matcher.fill_next_token_bitmask(self._bitmask)
        scores = torch.zeros(1, vocab_size)
        xgr.apply_token_bitmask_inplace(scores, self._bitmask)  # forbidden: -inf
        return (scores[0] == 0).to(device)

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(token))


def chunks_of(events: Sequence[str | ToolCall], new_tokens: int, prompt_tokens: int,
              finish: FinishReason | None = None) -> list[Chunk]:
    """Parser events -> Chunks in order (a chunk's calls follow its text): at least one,
    the tokens counted on the first, `finish` on the last."""
    chunks = [Chunk("", new_tokens, prompt_tokens)]
    for e in events:
        last = chunks[-1]
        if isinstance(e, ToolCall):
            last.tool_calls += (e,)
        elif last.tool_calls:
            chunks.append(Chunk(e, 0, prompt_tokens))
        else:
            last.text += e
    chunks[-1].finish = finish
    return chunks
