"""The request body of OpenAI's Responses API (`POST /v1/responses`), validated at the edge,
and its translation into a chat request, so that one set of checks and one way of
rendering messages serves both endpoints.

Unknown fields are ignored, as on the chat endpoint. zinfer keeps no state between
requests: `store: true` and `previous_response_id` are refused, and a conversation is
sent whole as `input` items each time (messages, the model's earlier `function_call`s
and the caller's `function_call_output`s).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from zinfer.gateway.openai_constraints import checked, response_format_constraint
from zinfer.gateway.openai_schema import ApiError, ChatRequest, Count, Name
from zinfer.messages.client import MAX_MESSAGES, CallId, Text, ToolName
from zinfer.messages.params import Constraint

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}  # Responses -> template
TEXT_PARTS = {"input_text", "output_text"}  # output_text: an earlier response's output sent back as input
MAX_TOOLS = 128
FORMATS = ("text", "json_object", "json_schema")


class InputPart(msgspec.Struct, kw_only=True):
    type: Name
    text: Text | None = None


Content = Text | Annotated[list[InputPart], Meta(max_length=MAX_MESSAGES)]


class InputItem(msgspec.Struct, kw_only=True):
    """One item of `input`: a message (type "message" or none, with role and content), a
    function_call the model made earlier, or the caller's function_call_output for it."""

    type: Name = "message"
    role: Annotated[str, Meta(max_length=64)] | None = None
    content: Content | None = None
    call_id: CallId | None = None
    name: ToolName | None = None
    arguments: Text | None = None
    output: Content | None = None


class TextFormat(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Name
    name: Name | None = None
    schema: dict[str, Any] | None = None
    description: Text | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None


class FunctionTool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool in the Responses API's flat shape (the chat API nests these under "function")."""

    type: Name
    name: ToolName | None = None
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedToolChoice(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Name
    name: Name | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    input: Text | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_MESSAGES)]
    model: Name | None = None
    instructions: Text | None = None
    max_output_tokens: Count | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: Name | None = None
    text: TextConfig | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Name | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


def check_stateless(req: ResponsesRequest) -> None:
    """ApiError 400 for what needs a stored response: zinfer keeps none."""
    stateless = "zinfer is stateless and keeps no responses"
    if req.store:
        raise ApiError(400, f"store: true is not supported: {stateless}; send store: false (or leave it out)",
                       param="store", code="invalid_value")
    if req.previous_response_id is not None:
        message = f"previous_response_id is not supported: {stateless}; send the whole conversation as input items"
        raise ApiError(400, message, param="previous_response_id", code="invalid_value")


def chat_request(req: ResponsesRequest) -> ChatRequest:
    """The chat request that asks the engine for the same generation: instructions as a
    system message before the input, max_output_tokens as max_tokens, tools and tool_choice
    in the chat API's shapes (text.format: text_constraint). Raises ApiError naming the
    Responses field at fault."""
    check_stateless(req)
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    items = [InputItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    messages += input_messages(items)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "stream": req.stream,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_tokens": req.max_output_tokens,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    try:
        return msgspec.convert({k: v for k, v in body.items() if v is not None}, ChatRequest)
    except msgspec.ValidationError as exc:  # bounds the Responses body does not check, e.g. a message's length
        raise ApiError(400, f"invalid request: {exc}", code="invalid_value") from None


def input_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Chat messages for the input items: function_calls become the tool_calls of an
    assistant message (the one just before, when the turn had text), a
    function_call_output a "tool" message answering an earlier call."""
    out: list[dict[str, Any]] = []  # chat messages
    calls: set[str | None] = set()  # the call_ids of the function_calls so far
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if item.type == "message":
            role = ROLES.get(item.role or "")
            if role is None:
                raise ApiError(400, f"unknown role {item.role!r}; a message's role is one of {', '.join(ROLES)}",
                               param=f"{at}.role", code="invalid_value")
            out.append({"role": role, "content": text_of(item.content, f"{at}.content")})
        elif item.type == "function_call":
            for field in ("call_id", "name", "arguments"):
                if getattr(item, field) is None:
                    raise ApiError(400, f"a function_call item needs {field}", param=f"{at}.{field}",
                                   code="missing_required_parameter")
            calls.add(item.call_id)
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            if out and out[-1]["role"] == "assistant":  # a turn's calls after its text: one assistant message
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            if item.call_id not in calls:
                message = f"no function_call with call_id {item.call_id!r} comes before this function_call_output"
                raise ApiError(400, message, param=f"{at}.call_id", code="invalid_value")
            if item.output is None:
                raise ApiError(400, "a function_call_output item needs output", param=f"{at}.output",
                               code="missing_required_parameter")
            out.append({"role": "tool", "content": text_of(item.output, f"{at}.output"), "tool_call_id": item.call_id})
        else:
            kinds = "message, function_call or function_call_output"
            message = f"input items of type {item.type!r} are not supported; use {kinds}"
            raise ApiError(400, message, param=f"{at}.type", code="invalid_value")
    return out


def text_of(content: Content | None, at: str) -> str:
    """A content string, or its text parts joined; other parts are refused naming their type."""
    if not isinstance(content, list):
        return content or ""
    for j, part in enumerate(content):
        if part.type not in TEXT_PARTS or part.text is None:
            message = f"content parts of type {part.type!r} are not supported; zinfer takes input_text parts"
            raise ApiError(400, message, param=f"{at}[{j}]", code="invalid_value")
    return "".join(p.text or "" for p in content)  # (every part has text: checked above)


def text_constraint(text: TextConfig | None) -> Constraint | None:
    """The checked Constraint text.format asks for (None for plain text); ApiError 400
    names the part of text.format at fault."""
    f = text.format if text else None
    if f is None or f.type == "text":
        return None
    if f.type not in FORMATS:
        raise ApiError(400, f"unknown text.format type {f.type!r}; one of {', '.join(FORMATS)}",
                       param="text.format.type", code="invalid_value")
    if f.type == "json_schema":
        for field in ("name", "schema"):
            if getattr(f, field) is None:
                raise ApiError(400, f"a json_schema text.format needs {field}", param=f"text.format.{field}",
                               code="missing_required_parameter")
    c = response_format_constraint(msgspec.to_builtins(f), "text.format")  # (None only for type "text")
    return checked(c, "text.format") if c is not None else None


def chat_tools(tools: list[FunctionTool] | None) -> list[dict[str, Any]] | None:
    """Function tools in the chat API's nested shape; other tool types are refused."""
    out = []
    for i, t in enumerate(tools or []):
        if t.type != "function":
            raise ApiError(400, f"tools of type {t.type!r} are not supported; zinfer takes function tools",
                           param=f"tools[{i}].type", code="invalid_value")
        if t.name is None:
            raise ApiError(400, "a function tool needs a name", param=f"tools[{i}].name",
                           code="missing_required_parameter")
        fn = {"name": t.name, "description": t.description, "parameters": t.parameters, "strict": t.strict}
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out or None


def chat_tool_choice(choice: str | NamedToolChoice | None) -> str | dict[str, Any] | None:
    """tool_choice in the chat API's shape: a mode, or {"type": "function", "function": {"name"}}
    (gateway/openai_tools.py checks it against the tools)."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.name is None:
        raise ApiError(400, 'a named tool_choice is {"type": "function", "name": ...}', param="tool_choice",
                       code="invalid_value")
    return {"type": choice.type, "function": {"name": choice.name}}


def echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a Response object repeats them (OpenAI's defaults filled in)."""
    fmt = msgspec.to_builtins(req.text.format) if req.text and req.text.format else {"type": "text"}
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "text": {"format": fmt},
        "tools": msgspec.to_builtins(req.tools or []),
        "tool_choice": msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
        "store": False,
        "previous_response_id": None,
        "truncation": "disabled",
        "metadata": {},
    }
