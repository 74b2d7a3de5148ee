"""Tool calls on the chat API: the request's tools and tool_choice checked, the model's
text parsed into OpenAI `tool_calls` (whole or as stream deltas, by
gateway/tool_call_parser.py, which lists the forms read), and the grammar that makes a
call compulsory.

tool_choice: "none" renders no tools and parses nothing; "auto" (the default with tools)
lets the model decide; "required" and a named function constrain the output to calls
(call_grammar) so the arguments validate against the function's schema; such a choice that
ends before its first call is whole (max_tokens ran out, a stop sequence cut it) is an error
naming the field (unfinished_call), never content without a call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from zinfer.gateway.openai_constraints import checked
from zinfer.gateway.openai_schema import ApiError, ChatRequest
from zinfer.gateway.tool_call_parser import TOOL_CLOSE, TOOL_OPEN, Call, ToolCallParser, parse_tool_calls
from zinfer.messages.json_schema import JSON_OPTIONS
from zinfer.messages.params import Constraint

MAX_SCHEMA_BYTES = 64 << 10  # one function's parameters schema, as JSON
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools as the engine and the parser need them.

    functions: the offered functions (ToolFunction maps for Generate.tools); choice:
    "auto", "required" or the one function's name the model must call; parallel: whether
    a constrained answer may hold several calls."""

    functions: list[dict[str, Any]]
    choice: str
    parallel: bool = True
    syntax: str = "hermes"  # how the model writes a call: "hermes" or "llama3" (models/tool_prompt.py)

    @property
    def names(self) -> set[str]:
        return {f["name"] for f in self.functions}

    @property
    def forced(self) -> bool:
        return self.choice != "auto"


def tool_plan(req: ChatRequest, syntax: str = "hermes") -> ToolPlan | None:
    """The request's ToolPlan for a model that writes calls in `syntax`, or None when the
    model must not call (no tools, or tool_choice "none"). ApiError 400 names the bad field."""
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ApiError(400, f"invalid tool_choice {choice!r}: one of {', '.join(CHOICES)} or a named function",
                           param="tool_choice", code="invalid_value")
        wanted, mode = None, choice
    else:
        if choice.type != "function":
            raise ApiError(400, f"a named tool_choice has type \"function\", got {choice.type!r}",
                           param="tool_choice.type", code="invalid_value")
        wanted = mode = choice.function.name
    if choice != "none" and not req.tools:
        raise ApiError(400, "tool_choice needs tools", param="tool_choice", code="invalid_value")
    if not req.tools or choice == "none":
        return None
    functions: list[dict[str, Any]] = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise ApiError(400, f"only tools of type \"function\" are supported, got {tool.type!r}",
                           param=f"tools[{i}].type", code="invalid_value")
        f = tool.function
        if f.parameters is not None and len(json.dumps(f.parameters)) > MAX_SCHEMA_BYTES:
            raise ApiError(400, f"a function's parameters schema is at most {MAX_SCHEMA_BYTES} bytes of JSON",
                           param=f"tools[{i}].function.parameters", code="invalid_value")
        fields = (("name", f.name), ("description", f.description), ("parameters", f.parameters), ("strict", f.strict))
        functions.append({k: v for k, v in fields if v is not None})
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ApiError(400, "tool function names must be unique", param="tools", code="invalid_value")
    if wanted is not None and wanted not in names:
        raise ApiError(400, f"tool_choice names the function {wanted!r}, which is not among the tools",
                       param="tool_choice", code="invalid_value")
    return ToolPlan(functions, mode, req.parallel_tool_calls is not False, syntax)


# ---- the grammar of a compulsory call ------------------------------------------------


def call_grammar(plan: ToolPlan) -> str:
    """llguidance Lark text allowing only calls of the plan's functions (the named one, or
    any for "required") in the plan's syntax: Hermes blocks (one, or one or more when
    plan.parallel), or Llama 3's one {"name": ..., "parameters": {...}} object."""
    allowed = [f for f in plan.functions if plan.choice == "required" or f["name"] == plan.choice]
    key = "parameters" if plan.syntax == "llama3" else "arguments"
    rules = []
    for i, f in enumerate(allowed):
        arguments = dict(f.get("parameters") or {"type": "object"})
        # "#/$defs/..." refs resolve from the root
        defs = {k: arguments.pop(k) for k in ("$defs", "definitions") if k in arguments}
        schema = {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, key: arguments},
            "required": ["name", key],
            "additionalProperties": False,
            "x-guidance": JSON_OPTIONS,  # the JSON laid out as json.dumps does: no whitespace to wander in
            **defs,
        }
        rules.append(f"fn{i}: %json {json.dumps(schema)}")
    body = " | ".join(f"fn{i}" for i in range(len(allowed)))
    if plan.syntax == "llama3":
        return "\n".join([f"start: {body}", *rules]) + "\n"
    start = 'start: call ("\\n" call)*' if plan.parallel else "start: call"
    return "\n".join([start, f'call: "{TOOL_OPEN}\\n" body "\\n{TOOL_CLOSE}"', f"body: {body}", *rules]) + "\n"


def tool_constraint(plan: ToolPlan, other: Constraint | None) -> Constraint:
    """The checked Constraint of a compulsory call (call_grammar); ApiError 400 when the
    request also asks for another structured output, or a schema does not compile."""
    if other is not None:
        forced = 'a compulsory tool call (tool_choice "required" or a named function)'
        raise ApiError(400, f"{forced} cannot be combined with a structured output", param="tool_choice",
                       code="invalid_value")
    return checked(Constraint("lark", call_grammar(plan)), "tools")


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_body(call: Call, call_id: str) -> dict[str, Any]:
    """One call of a whole response's message.tool_calls."""
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def call_deltas(call: Call, index: int, call_id: str) -> list[dict[str, Any]]:
    """A streamed call as OpenAI sends it: the id, type and name first, then the arguments."""
    named = {"name": call.name, "arguments": ""}
    return [
        {"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": named}]},
        {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]},
    ]


def unfinished_call(plan: ToolPlan | None, reason: str, calls: int) -> ApiError | None:
    """The error of a choice that had to call (tool_choice "required" or a named function) and
    ended with no whole call: the grammar allows no end before one, so max_tokens (or the
    context) ran out, or a stop sequence cut it. None when the choice called or was free not to."""
    if plan is None or not plan.forced or calls:
        return None
    if reason == "length":
        param, why = "max_tokens", "max_tokens ran out (raise it)"
    else:
        param, why = "stop", "a stop sequence cut it (leave it out)"
    return ApiError(400, f"the compulsory tool call (tool_choice {plan.choice!r}) was not complete when {why}",
                    param=param, code="tool_call_incomplete")


def finish_reason(reason: str, called: bool) -> str:
    """A choice that called a tool and stopped by itself finishes with "tool_calls"."""
    return "tool_calls" if called and reason == "stop" else reason


class StreamedCalls:
    """The chat deltas of a streamed request with tools: per choice a ToolCallParser, and
    its calls numbered 0, 1, ... with fresh ids."""

    def __init__(self, names: set[str]):
        self.names = names
        self.parsers: dict[int, ToolCallParser] = {}
        self.calls: dict[int, int] = {}  # choice -> calls sent

    def deltas(self, index: int, text: str) -> list[dict[str, Any]]:
        """The deltas (content, or a call's) that choice `index`'s new text makes sendable."""
        return self._bodies(index, self._parser(index).feed(text))

    def finish(self, index: int) -> list[dict[str, Any]]:
        """The deltas of what choice `index` held back, once its text has ended."""
        return self._bodies(index, self._parser(index).finish())

    def reason(self, index: int, reason: str) -> str:
        return finish_reason(reason, self.sent(index) > 0)

    def sent(self, index: int) -> int:
        """The calls choice `index` has sent."""
        return self.calls.get(index, 0)

    def _parser(self, index: int) -> ToolCallParser:
        return self.parsers.setdefault(index, ToolCallParser(set(self.names)))

    def _bodies(self, index: int, pieces: list[str | Call]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, str):
                out.append({"content": p})
            else:
                n = self.calls.get(index, 0)
                self.calls[index] = n + 1
                out.extend(call_deltas(p, n, new_call_id()))
        return out


def with_tool_calls(choice: dict[str, Any], names: set[str]) -> None:
    """Turn a whole response's chat choice into its parsed form: message.tool_calls, the
    content outside them (None when empty) and finish_reason "tool_calls"; no calls: unchanged."""
    content, calls = parse_tool_calls(choice["message"]["content"], names)
    if calls:
        choice["message"]["content"] = content
        choice["message"]["tool_calls"] = [call_body(c, new_call_id()) for c in calls]
        choice["finish_reason"] = finish_reason(choice["finish_reason"], True)
