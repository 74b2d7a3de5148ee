"""Ollama's request bodies (`/api/chat`, `/api/generate`, `/api/show`), validated at the edge,
and their translation into the chat and completion requests the OpenAI routes run, so one
set of checks (sampling, tools, the template, constraints) serves every protocol.

Unknown top-level fields are ignored, as Ollama (Go's JSON decoding) ignores them; an
unknown key in `options` is refused, naming it (Ollama only logs those). Options taken:
temperature, top_k, top_p, min_p, seed, num_predict (-1 and -2: up to the context), stop,
repeat_penalty, presence_penalty, frequency_penalty, num_ctx (the client's context need:
accepted when this server's context is at least that), typical_p 1 and num_keep (the
context never shifts here); repeat_last_n only as -1 (the whole context, how zinfer counts
repetitions) or without a repeat_penalty. Load-time options (num_gpu, num_thread,
num_batch, main_gpu, use_mmap) are `zinfer serve` flags and refused here. Unset sampling
options get the server's defaults (the model's recommended sampling), as on the OpenAI
routes. `keep_alive` is accepted: the model stays loaded for the server's life.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from zinfer.gateway.openai_constraints import response_format_constraint
from zinfer.gateway.openai_schema import (
    ApiError,
    CalledFunction,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    FunctionDef,
    Name,
    Stop,
    ToolCallIn,
    ToolDef,
)
from zinfer.messages.client import MAX_MESSAGES, MAX_TOOLS, Text, ToolName
from zinfer.messages.params import MAX_STOPS, TOKEN_ID_LIMIT, Constraint

LOAD_TIME_OPTIONS = ("num_gpu", "num_thread", "num_batch", "main_gpu", "use_mmap", "low_vram", "numa")
ROLES = ("system", "user", "assistant", "tool")
Number = Annotated[float, Meta(ge=-1e9, le=1e9)]


class Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_k: Annotated[int, Meta(ge=0, lt=TOKEN_ID_LIMIT)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    num_predict: Annotated[int, Meta(ge=-2, lt=TOKEN_ID_LIMIT)] | None = None
    num_ctx: Annotated[int, Meta(ge=1, lt=TOKEN_ID_LIMIT)] | None = None
    stop: Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    repeat_last_n: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    typical_p: Number | None = None
    num_keep: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    # load-time options: refused in sampling(), naming the `zinfer serve` flag's job
    num_gpu: Any = None
    num_thread: Any = None
    num_batch: Any = None
    main_gpu: Any = None
    use_mmap: Any = None
    low_vram: Any = None
    numa: Any = None


class OllamaFunction(msgspec.Struct, kw_only=True):
    name: ToolName
    description: Text | None = None
    parameters: dict[str, Any] | None = None


class OllamaTool(msgspec.Struct, kw_only=True):
    type: Name = "function"
    function: OllamaFunction


class CalledOllamaFunction(msgspec.Struct, kw_only=True):
    name: ToolName
    arguments: dict[str, Any] = {}
    index: int | None = None


class OllamaToolCall(msgspec.Struct, kw_only=True):
    function: CalledOllamaFunction
    id: Annotated[str, Meta(max_length=256)] | None = None


class OllamaMessage(msgspec.Struct, kw_only=True):
    role: Annotated[str, Meta(max_length=64)]
    content: Text = ""
    images: Annotated[list[str], Meta(max_length=0)] | None = None  # the models read text
    tool_calls: Annotated[list[OllamaToolCall], Meta(max_length=MAX_TOOLS)] | None = None
    thinking: Text | None = None  # an earlier answer's thinking: not sent back to the model
    tool_name: ToolName | None = None  # a tool message: the function it answers
    tool_call_id: Annotated[str, Meta(max_length=256)] | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: Name | None = None  # required: checked in the routes (None keeps read_request's type)
    format: Any = None  # "json", a JSON schema object, or "" / null
    options: Options | None = None
    stream: bool = True
    keep_alive: str | float | None = None
    think: bool | str | None = None


class OllamaChatRequest(_Common, kw_only=True):
    messages: Annotated[list[OllamaMessage], Meta(max_length=MAX_MESSAGES)] = []
    tools: Annotated[list[OllamaTool], Meta(max_length=MAX_TOOLS)] | None = None


class OllamaGenerateRequest(_Common, kw_only=True):
    prompt: Text = ""
    suffix: Text | None = None
    system: Text | None = None
    template: Text | None = None  # refused: the model's own template renders
    context: Annotated[list[int], Meta(max_length=0)] | None = None  # the deprecated token context: refused
    raw: bool = False
    images: Annotated[list[str], Meta(max_length=0)] | None = None


class ShowRequest(msgspec.Struct, kw_only=True):
    model: Name | None = None
    name: Name | None = None  # the older name of `model`
    verbose: bool = False


def check_common(req: _Common) -> None:
    if req.model is None or not req.model:
        raise ApiError(400, "model is required", param="model")
    if req.think not in (None, False, "", "false"):
        raise ApiError(400, f"model {req.model!r} does not support thinking", param="think")


def format_constraint(fmt: Any) -> Constraint | None:
    """`format`: "json" (any JSON object) or a JSON schema object."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return response_format_constraint({"type": "json_object"}, "format")
    if isinstance(fmt, dict):
        return response_format_constraint({"type": "json_schema", "schema": fmt}, "format")
    raise ApiError(400, "format is \"json\" or a JSON schema object", param="format")


def sampling(req: _Common, max_model_len: int) -> dict[str, Any]:
    """The chat/completion request fields of req's options."""
    o = req.options or Options()
    for name in LOAD_TIME_OPTIONS:
        if getattr(o, name) is not None:
            raise ApiError(400, f"{name} is set when the server starts (zinfer serve), not per request",
                           param=f"options.{name}")
    if o.num_ctx is not None and o.num_ctx > max_model_len:
        raise ApiError(400, f"num_ctx {o.num_ctx} is more than this server's context of {max_model_len} tokens "
                       "(zinfer serve --max-model-len)", param="options.num_ctx")
    if o.typical_p is not None and o.typical_p != 1.0:
        raise ApiError(400, "typical_p is not supported (only 1, off)", param="options.typical_p")
    penalized = o.repeat_penalty is not None and o.repeat_penalty != 1.0
    if penalized and o.repeat_last_n not in (None, -1):
        raise ApiError(400, "repeat_last_n: the repeat penalty counts the whole context here (-1)",
                       param="options.repeat_last_n")
    if o.num_predict == 0:
        raise ApiError(400, "num_predict is -1, -2 or at least 1", param="options.num_predict")
    max_tokens = None if o.num_predict is None or o.num_predict < 0 else o.num_predict
    return dict(temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p, seed=o.seed,
                max_tokens=max_tokens, stop=o.stop, repetition_penalty=o.repeat_penalty,
                presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty, stream=req.stream)


def chat_request(req: OllamaChatRequest, max_model_len: int) -> ChatRequest:
    """The chat request an /api/chat body asks for; ApiError 400 names a bad field."""
    check_common(req)
    tools = [ToolDef(type=t.type, function=FunctionDef(name=t.function.name, description=t.function.description,
                                                       parameters=t.function.parameters)) for t in req.tools or []]
    return ChatRequest(messages=chat_messages(req.messages), tools=tools or None, **sampling(req, max_model_len))


def chat_messages(messages: list[OllamaMessage]) -> list[ChatMessage]:
    """Ollama's messages as chat messages. Ollama's calls carry no ids: each gets one, and a
    tool message answers the earliest unanswered call (of its tool_name, when given)."""
    out: list[ChatMessage] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not yet answered
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ApiError(400, f"a message's role is one of {', '.join(ROLES)}, got {m.role!r}",
                           param=f"messages[{i}].role")
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for k, c in enumerate(m.tool_calls):
                call_id = c.id or f"call_{i}_{k}"
                arguments = msgspec.json.encode(c.function.arguments).decode()
                calls.append(ToolCallIn(id=call_id, function=CalledFunction(name=c.function.name, arguments=arguments)))
                open_calls.append((call_id, c.function.name))
            out.append(ChatMessage(role="assistant", content=m.content or None, tool_calls=calls))
        elif m.role == "tool":
            answered = next((c for c in open_calls if m.tool_call_id in (None, c[0])
                             and m.tool_name in (None, c[1])), None)
            if answered is not None:
                open_calls.remove(answered)
            call_id = m.tool_call_id or (answered[0] if answered else f"call_{i}")
            out.append(ChatMessage(role="tool", content=m.content, tool_call_id=call_id))
        else:
            out.append(ChatMessage(role=m.role, content=m.content))
    return out


def generate_request(req: OllamaGenerateRequest, max_model_len: int) -> ChatRequest | CompletionRequest:
    """The request an /api/generate body asks for: its prompt (and system) through the chat
    template, or as is with raw; a suffix is an infill (see gateway/ollama_api.py)."""
    check_common(req)
    if req.template is not None:
        raise ApiError(400, "template is not supported: the model's own chat template renders", param="template")
    fields = sampling(req, max_model_len)
    if req.raw or req.suffix is not None:
        if req.system is not None:
            raise ApiError(400, "system goes with a templated prompt, not raw or suffix", param="system")
        return CompletionRequest(prompt=req.prompt, **fields)
    messages = [ChatMessage(role="system", content=req.system)] if req.system else []
    messages.append(ChatMessage(role="user", content=req.prompt))
    return ChatRequest(messages=messages, **fields)
