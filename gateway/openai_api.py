"""OpenAI-compatible HTTP routes: chat and text completions (streamed or not), models, and
llama-server's unprefixed aliases of them (/tokenize and /detokenize: gateway/tokenize_api.py).

A generation's status is decided by its first event from the engine: a rejection
(too long: 400, queue full: 429, ...) is answered as an OpenAI error even when the
client asked to stream; otherwise a stream's 200 and headers go out with the first
token. A client that leaves, before or during the stream, cancels its engine request.
A list of prompts to /v1/completions runs as one engine request per prompt, answered
as one response (see engine_events).
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from zinfer.gateway.client import EngineClient
from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_schema import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    chat_messages,
    completion_prompts,
    include_usage,
    parse,
    sampling_params,
)
from zinfer.gateway.openai_constraints import constraint_field, constraint_from_request
from zinfer.gateway.openai_shaper import Shaper
from zinfer.gateway.openai_timings import TimedShaper
from zinfer.gateway.openai_tools import ToolPlan, tool_constraint, tool_plan
from zinfer.gateway.progress import Progress, watched
from zinfer.gateway.sse import SSEResponse, until_disconnect
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import (
    Cancelled,
    ClientEvent,
    Delta,
    Failed,
    Finished,
    Rejected,
    Started,
    Usage,
)
from zinfer.messages.params import Constraint, SamplingParams

Events = AsyncGenerator[ClientEvent, None]
"""One HTTP request's engine events (engine_events); closing it cancels what is still running."""
OpenEvents = Callable[[], AbstractAsyncContextManager[Events]]
"""Opens a request's Events (engine_events bound to its prompts): the engine work starts on entry."""


class ModelNamed(Protocol):
    """A request body that may name the model it is for."""

    model: str | None


Body = TypeVar("Body", bound=ModelNamed)
Parsed = TypeVar("Parsed")


class ReplyShaper(Protocol):
    """Turns one request's engine events into its reply (openai_shaper.Shaper for chat and
    completions, openai_responses.ResponsesShaper for /v1/responses)."""

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        """The HTTP error for a request the engine refused or did not finish."""

    async def collect(self, events: AsyncIterator[ClientEvent]) -> dict[str, Any] | ApiError:
        """The whole reply of a non-streamed request, or the error it ended with."""

    def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """The SSE frames of a streamed request from its first output on."""


def routes(state: GatewayState) -> list[Route]:
    async def chat(request: Request) -> Response:
        return await generate(state, request, ChatRequest)

    async def completions(request: Request) -> Response:
        return await generate(state, request, CompletionRequest)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(state)]})

    async def model(request: Request) -> Response:
        if not state.serves(request.path_params["model"]):
            return unknown_model(request.path_params["model"]).response()
        return JSONResponse(model_card(state))

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        # llama-server's unprefixed aliases
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/models", models, methods=["GET"]),
    ]


def model_card(state: GatewayState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": 0, "owned_by": "zinfer",
            "max_model_len": state.max_model_len, "sampling_defaults": state.sampling.as_dict()}


def unknown_model(name: str) -> ApiError:
    message = f"the model {name!r} does not exist; this server serves its own model only"
    return ApiError(404, message, param="model", code="model_not_found")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or ApiError 413 once it passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    size, chunks = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def generate(
    state: GatewayState,
    request: Request,
    kind: type[msgspec.Struct],
    answer: Callable[..., Awaitable[Response]] | None = None,
) -> Response:
    """Serve one generation request: `answer(state, request, kind, record)` (by default
    respond, for chat and text completions; /v1/responses brings its own) does the work.

    Its metrics record ends on every way out: here (an unexpected exception counts as
    failed), or when a LiveStream handed to Starlette has been sent.
    """
    record = state.metrics.open()
    response: Response | None = None
    try:
        work: Callable[..., Awaitable[Response]] = answer or respond
        response = await work(state, request, kind, record)
        return response
    except Exception:
        record.finish("failed")
        raise
    finally:
        if not isinstance(response, LiveStream):
            record.close()


async def respond(
    state: GatewayState, request: Request, kind: type[ChatRequest] | type[CompletionRequest], record: RequestRecord
) -> Response:
    """generate()'s work: validate, then answer whole, or hand back a LiveStream to send."""
    try:
        req: ChatRequest | CompletionRequest = await read_request(state, request, kind)
        params = sampling_params(req, state.max_model_len, state.sampling)
        plan = tool_plan(req, tool_syntax(state)) if isinstance(req, ChatRequest) else None
        params = constrained(params, constraint_from_request(req), plan)  # response_format, guided_*, ...
        forms = [chat_form(req, plan)] if isinstance(req, ChatRequest) else completion_prompts(req)
        check_sequences(state, len(forms), params.n)
    except ApiError as exc:
        record.finish("rejected")
        return exc.response()
    rid = uuid.uuid4().hex
    open_events: OpenEvents = partial(engine_events, state.engine(), forms, params, rid, record)
    # the field named when the engine refuses the grammar
    field = "tools" if plan is not None and plan.forced else constraint_field(req)
    shaper: ReplyShaper = Shaper(state, isinstance(req, ChatRequest), rid, plan, field)
    if req.timings_per_token:  # llama-server's timings, asked for
        progress = Progress()
        open_events, shaper = watched(open_events, progress), TimedShaper(shaper, progress)
    return await answer(request, shaper, open_events, req.stream, include_usage(req), record)


def check_sequences(state: GatewayState, prompts: int, n: int) -> None:
    """ApiError 400 when the request's sequences (prompts x n) outnumber what the engine's
    waiting queue holds: all are queued at once, so no retry could be admitted (429 is for
    a queue that is full now)."""
    if state.max_waiting and prompts * n > state.max_waiting:
        asked = f"{prompts} prompts x n={n}" if prompts > 1 else f"n={n}"
        limit = f"this server queues at most {state.max_waiting} at once (--max-waiting)"
        param = "prompt" if prompts > 1 else "n"
        raise ApiError(400, f"{asked} is {prompts * n} sequences; {limit}", param=param, code="too_many_sequences")


async def read_request(state: GatewayState, request: Request, kind: type[Body]) -> Body:
    """The body parsed as `kind`, once the model is loaded and if the request names it;
    ApiError (503, 4xx) otherwise."""
    state.engine()  # ApiError 503 while the model loads
    req = parse(await read_body(request, state.max_body_bytes), kind)
    if req.model is not None and not state.serves(req.model):
        raise unknown_model(req.model)
    return req


def tool_syntax(state: GatewayState) -> str:
    """How the served model writes tool calls ("hermes" or "llama3"), read from its template at start."""
    return str(state.extra.get("tool_syntax", "hermes"))


def constrained(params: SamplingParams, constraint: Constraint | None, plan: ToolPlan | None) -> SamplingParams:
    """params with the request's one constraint: a forced tool call's grammar ("required"
    or a named function: only calls allowed; it refuses a response format beside it), else
    the request's own constraint, if any."""
    if plan is not None and plan.forced:
        constraint = tool_constraint(plan, constraint)
    return params if constraint is None else msgspec.structs.replace(params, constraint=constraint)


async def answer(
    request: Request,
    shaper: ReplyShaper,
    open_events: OpenEvents,
    stream: bool,
    usage: bool,
    record: RequestRecord,
    live: type["LiveStream"] | None = None,
) -> Response:
    """The generation's reply: a LiveStream to send (stream; `live`: a subclass that
    frames the body otherwise, as NDJSON), else the shaper's whole answer once the engine
    finishes (499 when the client left first)."""
    if stream:
        return (live or LiveStream)(request, open_events, shaper, usage, record)
    async with open_events() as events:
        done, result = await until_disconnect(request, shaper.collect, events)
    if isinstance(result, ApiError):
        return result.response()
    return JSONResponse(result) if done else Response(status_code=499)


def chat_form(req: ChatRequest, plan: ToolPlan | None) -> dict[str, Any]:
    """generate() keywords of a chat request: its messages, and the functions to offer."""
    form: dict[str, Any] = {"messages": chat_messages(req)}
    if plan is not None:
        form["tools"] = plan.functions
    return form


@asynccontextmanager
async def engine_events(
    client: EngineClient, forms: list[dict[str, Any]], params: SamplingParams, rid: str, record: RequestRecord
) -> AsyncIterator[Events]:
    """One HTTP request's events from one engine request per prompt (`forms`), run in a
    nursery of the caller's: Started per prompt, Deltas with choice j of prompt p at index
    p * n + j, then one Finished with every prompt's finish reasons and their usage summed.

    Nothing but Started comes out until every prompt has given its first token or been
    refused, so a refusal of any prompt is the request's first output: it ends the events,
    and leaving the block cancels the other prompts. The channel from the per-prompt tasks
    is unbounded, as the engine client's per-request channels are.
    """
    tx, rx = trio.open_memory_channel[tuple[int, ClientEvent]](float("inf"))

    async def pump(p: int, form: dict[str, Any], tx: trio.MemorySendChannel[tuple[int, ClientEvent]]) -> None:
        async with tx:
            request_id = rid if len(forms) == 1 else f"{rid}-{p}"
            async for event in client.generate(**form, params=params, request_id=request_id):
                tx.send_nowait((p, event))

    async def merged() -> Events:
        waiting = set(range(len(forms)))  # prompts without a first token or refusal yet
        held: list[ClientEvent] = []  # events kept back until no prompt is waiting
        finished: dict[int, Finished] = {}  # prompt -> its Finished
        async for p, event in rx:
            if isinstance(event, (Rejected, Failed, Cancelled)):
                yield event
                return
            if isinstance(event, Delta):
                held.append(msgspec.structs.replace(event, index=p * params.n + event.index))
            elif isinstance(event, Finished):
                finished[p] = event
            else:
                held.append(event)
            if not isinstance(event, Started):
                waiting.discard(p)
            if not waiting:
                for e in held:
                    yield e
                held.clear()
            if len(finished) == len(forms):
                yield total(rid, [finished[i] for i in range(len(forms))])
                return
        yield Failed(rid, "the engine stream ended early")

    async with trio.open_nursery() as nursery:
        async with tx:
            for p, form in enumerate(forms):
                nursery.start_soon(pump, p, form, tx.clone())
        events = record.observe(merged())
        try:
            yield events
        finally:
            await events.aclose()
            nursery.cancel_scope.cancel()


def total(rid: str, parts: list[Finished]) -> Finished:
    """One Finished for the prompts of one request, in prompt order, usage summed."""
    usage = Usage(
        prompt_tokens=sum(f.usage.prompt_tokens for f in parts),
        completion_tokens=sum(f.usage.completion_tokens for f in parts),
        cached_tokens=sum(f.usage.cached_tokens for f in parts),
    )
    return Finished(rid, [r for f in parts for r in f.finish_reasons], usage)


class LiveStream(Response):
    """A streamed generation, run when Starlette sends this response, so the engine
    requests live in a nursery of that call. Its status is decided by the first output:
    a refusal is answered as an OpenAI error; otherwise an SSE stream's 200 and headers
    go out with the first token. The metrics record ends when it has been sent.
    """

    def __init__(
        self, request: Request, open_events: OpenEvents, shaper: ReplyShaper, usage: bool, record: RequestRecord
    ):
        super().__init__()
        self.request, self.open_events, self.shaper = request, open_events, shaper
        self.usage, self.record = usage, record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with self.open_events() as events:
                done, first = await until_disconnect(self.request, first_output, events)
                if not done or first is None:  # the client left
                    response: Response = Response(status_code=499)
                elif isinstance(first, (Rejected, Failed, Cancelled)):
                    response = self.shaper.error(first).response()
                else:
                    response = self.body_response(self.shaper.stream(first, events, self.usage), events.aclose)
                await response(scope, receive, send)
        except Exception:
            self.record.finish("failed")
            raise
        finally:
            self.record.close()

    def body_response(
        self, frames: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]
    ) -> Response:
        """The 200 response that sends a stream's frames: SSE here (a subclass may frame them otherwise)."""
        return SSEResponse(frames, on_close)


async def first_output(events: AsyncIterator[ClientEvent]) -> ClientEvent:
    """The first event after Started: a Delta, or a terminal that refuses the request."""
    while True:
        event = await events.__anext__()
        if not isinstance(event, Started):
            return event
