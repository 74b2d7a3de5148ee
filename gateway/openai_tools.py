"""Tool calls on the chat API: the request's tools and tool_choice checked, the model's
text parsed into OpenAI `tool_calls` (whole or as stream deltas), and the grammar that
makes a call compulsory.

What the model writes (Hermes and Qwen's format, which zinfer's fallback prompt asks
for too, see models/tool_prompt.py):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call; or Llama 3's JSON form, the whole message one object
{"name": ..., "parameters": {...}}, optionally after <|python_tag|>, for an offered name.
A block whose JSON is not a call object stays in the content as it was written.

tool_choice: "none" renders no tools and parses nothing; "auto" (the default with tools)
lets the model decide; "required" and a named function constrain the output to calls
(call_grammar) so the arguments validate against the function's schema.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from zinfer.actors.constraints import JSON_OPTIONS
from zinfer.gateway.openai_constraints import checked
from zinfer.gateway.openai_schema import ApiError, ChatRequest
from zinfer.messages.params import Constraint

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
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
    syntax: str = "hermes"  # how the model writes a call: "hermes" or "llama3" (models/tool_prompt.py call_syntax)

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
            raise ApiError(400, f"invalid tool_choice {choice!r}: one of {', '.join(CHOICES)} or a named function", param="tool_choice", code="invalid_value")
        wanted = None
    else:
        if choice.type != "function":
            raise ApiError(400, f"a named tool_choice has type \"function\", got {choice.type!r}", param="tool_choice.type", code="invalid_value")
        wanted = choice.function.name
    if choice != "none" and not req.tools:
        raise ApiError(400, "tool_choice needs tools", param="tool_choice", code="invalid_value")
    if not req.tools or choice == "none":
        return None
    functions = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise ApiError(400, f"only tools of type \"function\" are supported, got {tool.type!r}", param=f"tools[{i}].type", code="invalid_value")
        f = tool.function
        if f.parameters is not None and len(json.dumps(f.parameters)) > MAX_SCHEMA_BYTES:
            raise ApiError(400, f"a function's parameters schema is at most {MAX_SCHEMA_BYTES} bytes of JSON", param=f"tools[{i}].function.parameters", code="invalid_value")
        functions.append({k: v for k, v in (("name", f.name), ("description", f.description), ("parameters", f.parameters), ("strict", f.strict)) if v is not None})
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ApiError(400, "tool function names must be unique", param="tools", code="invalid_value")
    if wanted is not None and wanted not in names:
        raise ApiError(400, f"tool_choice names the function {wanted!r}, which is not among the tools", param="tool_choice", code="invalid_value")
    return ToolPlan(functions, wanted or choice, req.parallel_tool_calls is not False, syntax)


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
        defs = {k: arguments.pop(k) for k in ("$defs", "definitions") if k in arguments}  # "#/$defs/..." refs resolve from the root
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
        raise ApiError(400, "a compulsory tool call (tool_choice \"required\" or a named function) cannot be combined with a structured output", param="tool_choice", code="invalid_value")
    return checked(Constraint("lark", call_grammar(plan)), "tools")


# ---- parsing the model's text --------------------------------------------------------


@dataclass
class Call:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass
class ToolCallParser:
    """Splits a choice's text, fed as it streams, into content and Calls.

    feed() and finish() return pieces in order: str (content) or Call. Text that may
    still become a tag is held back, so no part of "<tool_call>" leaks into content;
    whitespace between content and a call is dropped. With `names` (the offered
    functions), a message that opens with "{" or <|python_tag|> is held whole and read
    as Llama 3's JSON call form at finish(). The same pieces come out however the text
    is split, so a stream reassembles to the whole response.
    """

    names: set[str] = field(default_factory=set)
    buf: str = ""
    state: str = "start"  # start (nothing decided yet), text, call (inside a tag), json (held whole)
    after_call: bool = False
    gap: str = ""  # the whitespace dropped before the open tag

    def feed(self, text: str) -> list[str | Call]:
        self.buf += text
        out: list[str | Call] = []
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if not head or (self.names and PYTHON_TAG.startswith(head[: len(PYTHON_TAG)]) and len(head) < len(PYTHON_TAG)):
                    return out
                self.state = "json" if self.names and (head.startswith("{") or head.startswith(PYTHON_TAG)) else "text"
            elif self.state == "json":
                return out
            elif self.state == "text":
                i = self.buf.find(TOOL_OPEN)
                if i < 0:
                    keep = len(self.buf) - _undecided_tail(self.buf)
                    self._content(out, self.buf[:keep])
                    self.buf = self.buf[keep:]
                    return out
                before = self.buf[:i].rstrip()
                self._content(out, before)
                self.gap = "" if self.after_call else self.buf[len(before):i]  # put back if the block is no call
                self.buf, self.state = self.buf[i + len(TOOL_OPEN):], "call"
            else:  # call
                j = self.buf.find(TOOL_CLOSE)
                if j < 0:
                    return out
                body, self.buf, self.state = self.buf[:j], self.buf[j + len(TOOL_CLOSE):], "text"
                self._block(out, body, TOOL_OPEN + body + TOOL_CLOSE)

    def finish(self) -> list[str | Call]:
        """The pieces held back, once the choice's text has ended."""
        out: list[str | Call] = []
        rest, self.buf = self.buf, ""
        if self.state == "json":
            call = _as_call(rest.strip().removeprefix(PYTHON_TAG), self.names, ("parameters", "arguments"))
            out.append(call if call else rest)
        elif self.state == "call":
            self._block(out, rest, TOOL_OPEN + rest)  # an unclosed last block counts when its JSON is whole
        elif not (self.after_call and not rest.strip()):
            self._content(out, rest)
        return out

    def _content(self, out: list, text: str) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            out.append(text)
            self.after_call = False

    def _block(self, out: list, body: str, as_written: str) -> None:
        call = _as_call(body.strip(), None, ("arguments", "parameters"))
        if call:
            out.append(call)
            self.after_call = True
        else:
            out.append(self.gap + as_written)
            self.after_call = False


def _undecided_tail(text: str) -> int:
    """Length of text's end that may still grow into a tool call tag: a prefix of
    "<tool_call>" and the whitespace before it (whitespace alone too)."""
    n = 0
    for k in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_OPEN.startswith(text[-k:]):
            n = k
            break
    return len(text) - len(text[: len(text) - n].rstrip())


def _as_call(text: str, names: set[str] | None, keys: tuple[str, ...]) -> Call | None:
    """A Call from a JSON object {"name": ..., <a key of keys>: {...}}; None when it is not
    one (or names a function outside `names`, when given)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or (names is not None and obj["name"] not in names):
        return None
    args = next((obj[k] for k in keys if k in obj), {})
    if isinstance(args, str):
        return Call(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, names: set[str] | None = None) -> tuple[str | None, list[Call]]:
    """(content, calls) of a whole choice's text: content is the text outside the calls,
    None when it is empty and there are calls."""
    p = ToolCallParser(set(names or ()))
    pieces = p.feed(text) + p.finish()
    content = "".join(x for x in pieces if isinstance(x, str))
    calls = [x for x in pieces if isinstance(x, Call)]
    return (content or None) if calls else content, calls


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_body(call: Call, call_id: str) -> dict:
    """One call of a whole response's message.tool_calls."""
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def call_deltas(call: Call, index: int, call_id: str) -> list[dict]:
    """A streamed call as OpenAI sends it: the id, type and name first, then the arguments."""
    return [
        {"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}]},
        {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]},
    ]


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

    def deltas(self, index: int, text: str) -> list[dict]:
        """The deltas (content, or a call's) that choice `index`'s new text makes sendable."""
        return self._bodies(index, self._parser(index).feed(text))

    def finish(self, index: int) -> list[dict]:
        """The deltas of what choice `index` held back, once its text has ended."""
        return self._bodies(index, self._parser(index).finish())

    def reason(self, index: int, reason: str) -> str:
        return finish_reason(reason, self.calls.get(index, 0) > 0)

    def _parser(self, index: int) -> ToolCallParser:
        return self.parsers.setdefault(index, ToolCallParser(set(self.names)))

    def _bodies(self, index: int, pieces: list[str | Call]) -> list[dict]:
        out: list[dict] = []
        for p in pieces:
            if isinstance(p, str):
                out.append({"content": p})
            else:
                n = self.calls.get(index, 0)
                self.calls[index] = n + 1
                out.extend(call_deltas(p, n, new_call_id()))
        return out


def with_tool_calls(choice: dict, names: set[str]) -> None:
    """Turn a whole response's chat choice into its parsed form: message.tool_calls, the
    content outside them (None when empty) and finish_reason "tool_calls"; no calls: unchanged."""
    content, calls = parse_tool_calls(choice["message"]["content"], names)
    if calls:
        choice["message"]["content"] = content
        choice["message"]["tool_calls"] = [call_body(c, new_call_id()) for c in calls]
        choice["finish_reason"] = finish_reason(choice["finish_reason"], True)
