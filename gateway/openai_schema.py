"""OpenAI's wire shapes: request bodies in (validated, turned into SamplingParams), errors out.

Requests are decoded with msgspec straight from the body bytes, so a wrong type or an
out-of-range value is refused with a message that names the field (`$.temperature`
becomes param "temperature"). Every number, string and list is bounded here or in
SamplingParams.validate(), so nothing a client sends can fail to encode on the way to
the engine. Unknown fields are ignored, as OpenAI-compatible servers do. Extensions
taken the way vLLM and llama-server take them, as extra body fields: top_k (-1 or 0:
off), min_p, repetition_penalty, ignore_eos, speculative ("ngram" / "draft" / "off"). The
structured-output fields (response_format, guided_*, structured_outputs, json_schema,
grammar) are decoded as given and checked in gateway/openai_constraints.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from starlette.responses import JSONResponse

from zinfer.messages.json_errors import validation_message
from zinfer.messages.client import MAX_MESSAGES, MAX_PROMPT_IDS, MAX_TOOLS, CallId, ToolName
from zinfer.messages.params import (
    MAX_IDS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    SEED_MAX,
    SEED_MIN,
    TOKEN_ID_LIMIT,
    SamplingParams,
)
from zinfer.models.sampling_defaults import SamplingDefaults


class ApiError(Exception):
    """A request refused with an HTTP status and an OpenAI-shaped error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        **extra: Any,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.extra = param, code, extra

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}
        return {"error": error}

    def response(self) -> JSONResponse:
        # 413 is sent before the body is read, so the server must drop the connection:
        # say so, or a client's pool reuses it and its next request meets the close
        headers = {"Connection": "close"} if self.status == 413 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


# ---- requests ---------------------------------------------------------------------------

Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Count = Annotated[int, Meta(ge=1, lt=TOKEN_ID_LIMIT)]
Name = Annotated[str, Meta(max_length=256)]
Stop = Annotated[str, Meta(max_length=MAX_STOP_CHARS)]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: Name
    text: str | None = None


class CalledFunction(msgspec.Struct):
    name: ToolName
    arguments: str  # JSON text


class ToolCallIn(msgspec.Struct):
    """An assistant message's tool call in the history."""

    id: CallId
    function: CalledFunction
    type: Name = "function"


class ChatMessage(msgspec.Struct):
    role: Annotated[str, Meta(max_length=64)]
    content: str | Annotated[list[ContentPart], Meta(max_length=MAX_MESSAGES)] | None = None
    name: Name | None = None
    tool_call_id: CallId | None = None  # role "tool": the call it answers
    tool_calls: Annotated[list[ToolCallIn], Meta(max_length=MAX_TOOLS)] | None = None  # role "assistant"


class FunctionDef(msgspec.Struct):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema object (size checked in openai_tools)
    strict: bool | None = None


class ToolDef(msgspec.Struct):
    type: Name
    function: FunctionDef


class FunctionName(msgspec.Struct):
    name: Name


class NamedToolChoice(msgspec.Struct):
    type: Name
    function: FunctionName


class _Sampling(msgspec.Struct, kw_only=True):
    """Fields both endpoints share. None means "not given": the OpenAI default applies."""

    model: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=16)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    max_tokens: Count | None = None
    stop: Stop | Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    seed: int | None = None  # 64 bits, signed or not: checked in sampling_params (Meta stops at int64)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: Annotated[dict[str, Bias], Meta(max_length=MAX_IDS)] | None = None
    top_k: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    min_p: Unit | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    ignore_eos: bool = False
    speculative: str | None = None  # "ngram", "draft" (a draft model's) or "off"; None: the server's default
    timings_per_token: bool = False  # llama-server's: the reply carries its timings (gateway/openai_timings.py)
    # Structured output, checked and turned into one Constraint by gateway/openai_constraints.py:
    response_format: Any = None  # OpenAI
    guided_json: Any = None  # vLLM's guided_* and structured_outputs
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    json_schema: Any = None  # llama-server's json_schema and grammar (GBNF)
    grammar: Any = None


class ChatRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    tools: Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Name | NamedToolChoice | None = None  # "none", "auto", "required" or a function (openai_tools.py)
    parallel_tool_calls: bool | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: Any
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    best_of: Annotated[int, Meta(ge=1, le=16)] | None = None  # only equal to n: see sampling_params


COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_PATH = re.compile(r"at `\$\.?([^`]*)`")


Body = TypeVar("Body")


def parse(body: bytes, kind: type[Body]) -> Body:
    """Decode and type-check a request body; ApiError 400 names the bad field."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        m = _PATH.search(str(exc))
        missing = re.search(r"missing required field `([^`]*)`", str(exc))
        param = m.group(1).replace("[...]", "") if m else missing.group(1) if missing else None
        raise ApiError(400, f"invalid request: {validation_message(exc, body)}",
                       param=param, code="invalid_value") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # msgspec's decoder recurses per nesting level
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None


ROLES = {  # OpenAI's role -> the template's
    "system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
}
MAX_PROMPTS = 64  # prompts in one /v1/completions request


def chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Messages as the engine takes them (messages/client.py Message): role and text
    content (text parts joined), and the tool fields: an assistant's tool_calls (its
    content may then be null), a tool message's tool_call_id.

    "developer" is OpenAI's newer name for "system" and is passed on as that.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        role = ROLES.get(m.role)
        if role is None:
            raise ApiError(400, f"unknown role {m.role!r}; a message's role is one of {', '.join(ROLES)}",
                           param=f"messages[{i}].role", code="invalid_value")
        if isinstance(m.content, list):
            bad = [p.type for p in m.content if p.type != "text" or p.text is None]
            if bad:
                raise ApiError(400, f"only text content parts are supported, got {bad[0]!r}",
                               param=f"messages[{i}].content")
            content = "".join(p.text or "" for p in m.content)  # (every part has text: checked above)
        else:
            content = m.content or ""
        turn: dict[str, Any] = {"role": role, "content": content}
        if role == "tool":
            if m.tool_call_id is None:
                raise ApiError(400, "a tool message needs the tool_call_id of the call it answers",
                               param=f"messages[{i}].tool_call_id", code="invalid_value")
            turn["tool_call_id"] = m.tool_call_id
        if m.tool_calls and role == "assistant":
            bad = [c.type for c in m.tool_calls if c.type != "function"]
            if bad:
                raise ApiError(400, f"only tool calls of type \"function\" are supported, got {bad[0]!r}",
                               param=f"messages[{i}].tool_calls", code="invalid_value")
            turn["tool_calls"] = [_tool_call(c) for c in m.tool_calls]
            turn["content"] = content or None
        if m.name is not None:
            turn["name"] = m.name
        out.append(turn)
    return out


def _tool_call(c: ToolCallIn) -> dict[str, Any]:
    """A history message's tool call as the engine takes it (messages/client.py ToolCall)."""
    return {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}


def completion_prompts(req: CompletionRequest) -> list[dict[str, Any]]:
    """Each prompt as generate() keywords (text or token ids): the prompt is a string, a
    list of token ids, or a list of up to MAX_PROMPTS of those."""
    p = req.prompt
    many = isinstance(p, list) and bool(p) and all(isinstance(x, (str, list)) for x in p)
    prompts = p if many else [p]
    if len(prompts) > MAX_PROMPTS:
        raise ApiError(400, f"at most {MAX_PROMPTS} prompts in one request, got {len(prompts)}",
                       param="prompt", code="invalid_value")
    return [_one_prompt(x) for x in prompts]


def _one_prompt(p: Any) -> dict[str, Any]:
    if isinstance(p, str):
        return {"prompt": p}
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if len(p) > MAX_PROMPT_IDS or not all(0 <= t < TOKEN_ID_LIMIT for t in p):
            raise ApiError(400, f"prompt token ids must be 0 to 2**31-1, at most {MAX_PROMPT_IDS} of them",
                           param="prompt", code="invalid_value")
        return {"prompt_ids": p}
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of those", param="prompt")


OPENAI_DEFAULTS = SamplingDefaults()


def sampling_params(
    req: ChatRequest | CompletionRequest, max_model_len: int, defaults: SamplingDefaults = OPENAI_DEFAULTS
) -> SamplingParams:
    """SamplingParams with the server's defaults for unset fields: the model's recommended
    sampling where its files give one, else OpenAI's (temperature 1, top_p 1); max_tokens
    16 for completions and up to the context for chat."""
    if isinstance(req, CompletionRequest) and req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if isinstance(req, CompletionRequest) and req.best_of not in (None, req.n or 1):
        # as vLLM's V1 engine: no extra choices ranked by log probability (ask for n with logprobs instead)
        message = f"best_of is not supported unless it equals n ({req.n or 1}), got {req.best_of}"
        raise ApiError(400, message, param="best_of", code="invalid_value")
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
    if isinstance(req, ChatRequest):
        max_tokens = req.max_completion_tokens or req.max_tokens
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        max_tokens, logprobs = req.max_tokens or COMPLETION_MAX_TOKENS, req.logprobs
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise ApiError(400, "stop sequences must not be empty", param="stop")
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX:
        message = f"invalid value for seed: an integer from -2**63 to 2**64-1, got one of {req.seed.bit_length()} bits"
        raise ApiError(400, message, param="seed", code="invalid_value")
    p = SamplingParams(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_k=defaults.top_k if req.top_k is None else max(req.top_k, 0),
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        min_p=defaults.min_p if req.min_p is None else req.min_p,
        repetition_penalty=defaults.repetition_penalty if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=bias,
        seed=req.seed,
        max_tokens=max_tokens or max_model_len,
        stop=stop,
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        n=req.n or 1,
        speculative=req.speculative,
    )
    try:
        p.validate()
    except ValueError as exc:
        m = re.match(r"invalid value for (\w+)", str(exc))
        raise ApiError(400, str(exc), param=m.group(1) if m else None, code="invalid_value") from None
    return p


def include_usage(req: ChatRequest | CompletionRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
