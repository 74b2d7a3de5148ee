"""The public protocol between clients and the engine's front door (actors/front_door_actor.py).

Clients are the Python API, the HTTP/websocket gateways, `zinfer stdio` and external
ZeroMQ clients, so these Structs are maps with a "type" tag: readable from any
language's msgpack library. One request ends with exactly one terminal event:
Finished, Cancelled, Rejected or Failed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from zinfer.messages.params import TOKEN_ID_LIMIT, SamplingParams

_MAP = dict(tag_field="type", omit_defaults=True, forbid_unknown_fields=True)

# Bounds on what a client sends, checked as a request is decoded (ZeroMQ, stdio and
# AsyncClient before it sends): a request outside them is refused as bad_request.
MAX_REQUEST_ID = 256
MAX_TEXT = 4 << 20
"""Characters in a prompt, a text to tokenize or one message field (the HTTP body cap is 4 MiB too)."""
MAX_MESSAGES = 1024
MAX_PROMPT_IDS = 1 << 20

RequestId = Annotated[str, Meta(max_length=MAX_REQUEST_ID)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
TokenId = Annotated[int, Meta(ge=0, lt=TOKEN_ID_LIMIT)]
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_PROMPT_IDS)]
MAX_TOOLS = 128
"""Tools one request may offer (OpenAI's limit), and tool calls one assistant message may hold."""
ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}\Z")]  # \Z: "$" matches before a final newline
CallId = Annotated[str, Meta(max_length=MAX_REQUEST_ID)]


class ToolFunction(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A function the model may call: its name, what it does, its arguments' JSON schema."""

    name: ToolName
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema object; the gateways cap its size
    strict: bool | None = None


class CalledFunction(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: ToolName
    arguments: Text  # a JSON text, as OpenAI sends it (the template may get it parsed)


class ToolCall(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One call of an assistant message in the history: OpenAI's {id, type, function}."""

    id: CallId
    function: CalledFunction
    type: Literal["function"] = "function"


class Message(msgspec.Struct, omit_defaults=True):
    """One chat message. content is None for an assistant message that only calls tools;
    tool_call_id names the call a "tool" message answers. Unknown keys are ignored."""

    role: Annotated[str, Meta(max_length=64)]
    content: Text | None = None
    name: Annotated[str, Meta(max_length=256)] | None = None
    tool_call_id: CallId | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=MAX_TOOLS)] | None = None


Messages = Annotated[list[Message], Meta(max_length=MAX_MESSAGES)]
Tools = Annotated[list[ToolFunction], Meta(max_length=MAX_TOOLS)]


class Generate(msgspec.Struct, tag="generate", **_MAP):
    """Start a generation from exactly one of: prompt (raw text), messages (chat), prompt_ids."""

    request_id: RequestId
    prompt: Text | None = None
    messages: Messages | None = None
    prompt_ids: TokenIds | None = None
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    add_special: bool = True  # prepend BOS as the model says, for prompt text
    traceparent: Annotated[str, Meta(max_length=128)] | None = None
    tools: Tools | None = None  # with messages: functions the chat template offers the model


class Cancel(msgspec.Struct, tag="cancel", **_MAP):
    request_id: RequestId


class Tokenize(msgspec.Struct, tag="tokenize", **_MAP):
    """Count or encode: text, or chat messages rendered through the template."""

    request_id: RequestId
    text: Text | None = None
    messages: Messages | None = None
    add_special: bool = True
    tools: Tools | None = None  # with messages, as in Generate


class Detokenize(msgspec.Struct, tag="detokenize", **_MAP):
    request_id: RequestId
    token_ids: TokenIds


class GetStats(msgspec.Struct, tag="stats", **_MAP):
    request_id: RequestId


ClientRequest = Union[Generate, Cancel, Tokenize, Detokenize, GetStats]


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float


class Started(msgspec.Struct, tag="started", **_MAP):
    """The request was admitted: its prompt is tokenized and queued."""

    request_id: str
    prompt_tokens: int


class Delta(msgspec.Struct, tag="delta", **_MAP):
    """New text of choice `index`; the last delta of a choice carries its finish_reason."""

    request_id: str
    index: int = 0
    text: str = ""
    token_ids: list[int] = []
    logprobs: list[float] | None = None
    top_logprobs: list[list[TopLogprob]] | None = None
    finish_reason: str | None = None


class Usage(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for the request
    accepted_tokens: int = 0  # of those, the ones verification kept (part of completion_tokens)


class Finished(msgspec.Struct, tag="finished", **_MAP):
    """Terminal: every choice ended ("stop": EOS, stop token or stop string; "length")."""

    request_id: str
    finish_reasons: list[str]
    usage: Usage
    prompt_ids: list[int] = []


class Cancelled(msgspec.Struct, tag="cancelled", **_MAP):
    """Terminal: the client cancelled (or went away)."""

    request_id: str
    usage: Usage = msgspec.field(default_factory=Usage)


class Rejected(msgspec.Struct, tag="rejected", **_MAP):
    """Terminal: never started. code: "too_long", "queue_full", "bad_request", "bad_constraint"
    (the grammar check refused the constraint), "cannot_fit"."""

    request_id: str
    code: str
    message: str
    n_prompt_tokens: int = 0
    n_ctx: int = 0


class Failed(msgspec.Struct, tag="failed", **_MAP):
    """Terminal: the engine could not finish it. code "engine_failed": an actor died or
    failed it; "bad_constraint": its grammar could not be followed (a rule that never
    completes, a parser limit reached), the request's own problem."""

    request_id: str
    message: str
    code: str = "engine_failed"


class TokenizeResult(msgspec.Struct, tag="tokenized", **_MAP):
    request_id: str
    token_ids: list[int]
    text: str = ""


class EngineStats(msgspec.Struct, tag="stats", **_MAP):
    """The scheduler's state as of its last round."""

    request_id: str = ""
    running: int = 0
    waiting: int = 0
    kv_blocks: int = 0
    kv_used_blocks: int = 0
    kv_cached_blocks: int = 0
    rounds: int = 0
    open_requests: int = 0
    drafted_tokens: int = 0  # speculative tokens drafted since the engine started
    accepted_tokens: int = 0  # of those, the ones verification kept


ClientEvent = Union[Started, Delta, Finished, Cancelled, Rejected, Failed, TokenizeResult, EngineStats]
TERMINAL_EVENTS = (Finished, Cancelled, Rejected, Failed, TokenizeResult, EngineStats)


class _RequestIdOnly(msgspec.Struct):
    request_id: str = ""


REQUEST_ID_DECODERS: dict[str, msgspec.msgpack.Decoder[_RequestIdOnly] | msgspec.json.Decoder[_RequestIdOnly]] = {
    "msgpack": msgspec.msgpack.Decoder(_RequestIdOnly), "json": msgspec.json.Decoder(_RequestIdOnly)}


def request_id_of(data: bytes | memoryview, encoding: str) -> str:
    """The string request_id of a malformed request (msgpack or JSON) that is a map holding
    one of at most MAX_REQUEST_ID characters, so its rejection can name it; else ""."""
    try:
        rid = REQUEST_ID_DECODERS[encoding].decode(data).request_id
    except (msgspec.MsgspecError, RecursionError):
        return ""
    return rid if len(rid) <= MAX_REQUEST_ID else ""
