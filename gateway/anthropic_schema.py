"""The Anthropic Messages API's request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`),
validated at the edge, and their translation into a chat request, so one set of checks
(sampling, tools, the template) serves both APIs.

Unknown fields are refused, as Anthropic refuses them. Content blocks: text, tool_use (an
assistant's calls) and tool_result (a user's answers, each sent as a tool message); image
and document blocks are refused (the models read text). `thinking` is accepted and has no
effect (the models served think in plain text, if at all), as are assistant thinking
blocks in the history (Anthropic drops them from earlier turns too); `cache_control` is
accepted everywhere: the engine caches every prompt's prefix by itself. `metadata.user_id`
is accepted (it only identifies the caller to Anthropic). `output_config.format` (a JSON
schema) constrains the answer; its `effort` is accepted like `thinking`. temperature,
top_p and top_k, which newer SDKs no longer list, are taken as the HTTP API defines them
(send them with extra_body).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from zinfer.gateway.openai_constraints import response_format_constraint
from zinfer.gateway.openai_schema import (
    ApiError,
    CalledFunction,
    ChatMessage,
    ChatRequest,
    Count,
    FunctionDef,
    FunctionName,
    Name,
    NamedToolChoice,
    Stop,
    ToolCallIn,
    ToolDef,
)
from zinfer.messages.client import MAX_MESSAGES, MAX_TOOLS, CallId, Text, ToolName
from zinfer.messages.params import MAX_STOPS, Constraint

TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # Anthropic's -> the chat API's ("tool": named)
THINKING = ("enabled", "disabled", "adaptive", "between_tools")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
SPEEDS = ("standard",)
CHAT_PARAMS = {"stop": "stop_sequences", "parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}


class TextBlock(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True, kw_only=True):
    text: Text
    cache_control: dict[str, Any] | None = None
    citations: Annotated[list[Any], Meta(max_length=0)] | None = None  # citing documents: none here


class ImageBlock(msgspec.Struct, tag_field="type", tag="image", kw_only=True):
    source: Any = None  # refused in chat_request


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document", kw_only=True):
    source: Any = None  # refused in chat_request


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", forbid_unknown_fields=True, kw_only=True):
    id: CallId
    name: ToolName
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", forbid_unknown_fields=True, kw_only=True):
    tool_use_id: CallId
    content: Text | Annotated[list[TextBlock | ImageBlock], Meta(max_length=MAX_MESSAGES)] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None
    toolset_name: None = None


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", forbid_unknown_fields=True, kw_only=True):
    thinking: Text
    signature: Annotated[str, Meta(max_length=1 << 16)] | None = None


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking", forbid_unknown_fields=True):
    data: Annotated[str, Meta(max_length=1 << 16)]


Block = TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
Blocks = Annotated[list[Block], Meta(max_length=MAX_MESSAGES)]


class MessageParam(msgspec.Struct, forbid_unknown_fields=True):
    role: Annotated[str, Meta(max_length=64)]
    content: Text | Blocks


class ToolParam(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: ToolName
    input_schema: dict[str, Any]
    description: Text | None = None
    type: Name | None = None  # "custom" (or none): a client tool; Anthropic's server tools are refused
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None  # a forced call's input follows the schema (a grammar) whether or not
    eager_input_streaming: bool | None = None  # an input streams as one delta once the call is whole
    input_examples: Annotated[list[Any], Meta(max_length=0)] | None = None
    defer_loading: bool | None = None  # true: refused in tool_def
    allowed_callers: list[Annotated[str, Meta(pattern="^direct$")]] | None = None


class ToolChoiceParam(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: Name
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: Name
    budget_tokens: Annotated[int, Meta(ge=0)] | None = None
    display: Name | None = None


class OutputFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Name
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    effort: Name | None = None  # how hard a thinking model thinks: accepted, no effect (see the docstring)
    format: OutputFormat | None = None  # the answer is JSON following format.schema


class Metadata(msgspec.Struct, forbid_unknown_fields=True):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


System = Text | Annotated[list[TextBlock], Meta(max_length=MAX_MESSAGES)]
Messages = Annotated[list[MessageParam], Meta(min_length=1, max_length=MAX_MESSAGES)]


class CountTokensRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: Name | None = None  # required: chat_request says so (None keeps read_request's type)
    messages: Messages
    system: System | None = None
    tools: Annotated[list[ToolParam], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, forbid_unknown_fields=True, kw_only=True):
    max_tokens: Count
    stop_sequences: Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0, lt=2**31)] | None = None
    metadata: Metadata | None = None
    service_tier: Annotated[str, Meta(max_length=64)] | None = None  # "auto" or "standard_only": one tier here
    speed: Name | None = None  # "standard" only


def output_constraint(req: CountTokensRequest) -> Constraint | None:
    """The JSON schema constraint of output_config.format, or None."""
    fmt = req.output_config.format if req.output_config else None
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        raise ApiError(400, "output_config.format.type is 'json_schema'", param="output_config.format.type")
    return response_format_constraint({"type": "json_schema", "schema": fmt.schema}, "output_config.format")


def renamed(exc: ApiError) -> ApiError:
    """exc with a chat field in `param` renamed to the Messages API field it came from."""
    if exc.param:
        exc.param = CHAT_PARAMS.get(exc.param, exc.param)
        if exc.param.startswith("tools[") and exc.param.endswith(".function.parameters"):
            exc.param = exc.param.removesuffix(".function.parameters") + ".input_schema"
    return exc


def chat_request(req: CountTokensRequest) -> ChatRequest:
    """The chat request req asks for; ApiError 400 names what the chat API cannot take."""
    if req.model is None:
        raise ApiError(400, "model: Field required", param="model")
    if req.thinking is not None and req.thinking.type not in THINKING:
        raise ApiError(400, f"thinking.type is one of {', '.join(THINKING)}", param="thinking.type")
    effort = req.output_config.effort if req.output_config else None
    if effort not in (None, *EFFORTS):
        raise ApiError(400, f"output_config.effort is one of {', '.join(EFFORTS)}", param="output_config.effort")
    sampling: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        if req.service_tier not in (None, "auto", "standard_only"):
            raise ApiError(400, "service_tier is 'auto' or 'standard_only'", param="service_tier")
        if req.speed not in (None, *SPEEDS):
            raise ApiError(400, "speed 'standard' is the only speed here", param="speed")
        sampling = dict(max_tokens=req.max_tokens, stop=req.stop_sequences, stream=req.stream,
                        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    tools = [tool_def(i, t) for i, t in enumerate(req.tools or [])] or None
    choice, parallel = tool_choice(req.tool_choice)
    return ChatRequest(messages=chat_messages(req), tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                       **sampling)


def tool_def(i: int, t: ToolParam) -> ToolDef:
    if t.defer_loading:
        raise ApiError(400, "deferred tool loading (a tool search tool) is not supported",
                       param=f"tools[{i}].defer_loading")
    if t.type not in (None, "custom"):
        raise ApiError(400, f"only client tools (type 'custom') are supported, got {t.type!r}",
                       param=f"tools[{i}].type")
    function = FunctionDef(name=t.name, description=t.description, parameters=t.input_schema, strict=t.strict)
    return ToolDef(type="function", function=function)


def tool_choice(c: ToolChoiceParam | None) -> tuple[str | NamedToolChoice | None, bool | None]:
    """The chat API's tool_choice and parallel_tool_calls for Anthropic's tool_choice."""
    if c is None:
        return None, None
    parallel = None if c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
    if c.type == "tool":
        if c.name is None:
            raise ApiError(400, "a tool_choice of type 'tool' names the tool", param="tool_choice.name")
        return NamedToolChoice(type="function", function=FunctionName(name=c.name)), parallel
    if c.type not in TOOL_CHOICES:
        raise ApiError(400, f"tool_choice.type is one of auto, any, tool, none; got {c.type!r}",
                       param="tool_choice.type")
    if c.name is not None:
        raise ApiError(400, "tool_choice.name goes with type 'tool' only", param="tool_choice.name")
    return TOOL_CHOICES[c.type], parallel


def system_text(system: System | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    return "\n".join(b.text for b in system)


def chat_messages(req: CountTokensRequest) -> list[ChatMessage]:
    """The system prompt and messages as chat messages: an assistant's tool_use blocks are
    its tool_calls, a user's tool_result blocks are tool messages before its text."""
    out: list[ChatMessage] = []
    system = system_text(req.system)
    if system:
        out.append(ChatMessage(role="system", content=system))
    for i, m in enumerate(req.messages):
        blocks: list[Any] = [TextBlock(text=m.content)] if isinstance(m.content, str) else list(m.content)
        where = f"messages[{i}].content"
        if m.role == "user":
            out.extend(_user_turn(blocks, where))
        elif m.role == "assistant":
            out.append(_assistant_turn(blocks, where))
        else:
            raise ApiError(400, f"a message's role is user or assistant, got {m.role!r}", param=f"messages[{i}].role")
    return out


def _refuse(block: Any, where: str) -> None:
    kind = type(block).__name__.removesuffix("Block").lower()
    raise ApiError(400, f"{kind} content blocks are not supported here (the model reads text)", param=where)


def _user_turn(blocks: list[Any], where: str) -> list[ChatMessage]:
    out, texts = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolResultBlock):
            out.append(ChatMessage(role="tool", content=_result_text(b, f"{where}[{j}].content"),
                                   tool_call_id=b.tool_use_id))
        elif isinstance(b, ToolUseBlock):
            raise ApiError(400, "tool_use blocks belong to assistant messages", param=f"{where}[{j}]")
        else:
            _refuse(b, f"{where}[{j}].type")
    if texts or not out:
        out.append(ChatMessage(role="user", content="\n".join(texts)))
    return out


def _result_text(b: ToolResultBlock, where: str) -> str:
    if isinstance(b.content, list):
        for k, part in enumerate(b.content):
            if not isinstance(part, TextBlock):
                _refuse(part, f"{where}[{k}].type")
        text = "\n".join(p.text for p in b.content if isinstance(p, TextBlock))
    else:
        text = b.content or ""
    return f"Error: {text}" if b.is_error else text


def _assistant_turn(blocks: list[Any], where: str) -> ChatMessage:
    texts, calls = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            arguments = json.dumps(b.input, ensure_ascii=False)
            calls.append(ToolCallIn(id=b.id, function=CalledFunction(name=b.name, arguments=arguments)))
        elif isinstance(b, ToolResultBlock):
            raise ApiError(400, "tool_result blocks belong to user messages", param=f"{where}[{j}]")
        elif not isinstance(b, (ThinkingBlock, RedactedThinkingBlock)):
            _refuse(b, f"{where}[{j}].type")
    return ChatMessage(role="assistant", content="".join(texts) or (None if calls else ""), tool_calls=calls or None)
