"""OpenAI's Responses API, `POST /v1/responses`: one generation answered as a Response
object, or streamed as its typed SSE events.

A request is checked as a Responses body (gateway/openai_responses_schema.py), then runs
as the chat request it translates to, through the chat endpoint's machinery: the same
metrics record, engine events, refusal-before-200 and cancellation when the client
leaves (gateway/openai_api.py). Only the shapes out differ, made here by ResponsesShaper.

The stream is, in order: response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta
(one per text delta), response.output_text.done, response.content_part.done,
response.output_item.done, then exactly one of response.completed,
response.incomplete (max_output_tokens reached) or response.failed (the engine failed
mid-stream). Each event has an `event:` line with its type and a sequence_number.
"""

from __future__ import annotations

import time
import uuid
from functools import partial
from itertools import count
from typing import Any, AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_api import LiveStream, engine_events, generate, read_body, unknown_model
from zinfer.gateway.openai_responses_schema import ResponsesRequest, chat_request, echo, text_constraint
from zinfer.gateway.openai_schema import ApiError, chat_messages, parse, sampling_params
from zinfer.gateway.openai_shaper import engine_error
from zinfer.gateway.sse import frame, until_disconnect
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected, Usage

CHAT_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input"}  # a chat field named in an error -> the Responses field


def routes(state: GatewayState) -> list[Route]:
    async def responses(request: Request) -> Response:
        return await generate(state, request, ResponsesRequest, respond)

    return [Route("/v1/responses", responses, methods=["POST"])]


def renamed(exc: ApiError) -> ApiError:
    """exc with a chat field in `param` renamed to the Responses field it came from."""
    exc.param = CHAT_PARAMS.get(exc.param, exc.param)
    return exc


async def respond(state: GatewayState, request: Request, kind: type[ResponsesRequest], record: RequestRecord) -> Response:
    """Validate, then answer whole, or hand back a LiveStream to send (as chat does)."""
    try:
        if not state.ready:
            raise ApiError(503, "the model is loading", type="unavailable_error", code="loading")
        req = parse(await read_body(request, state.max_body_bytes), kind)
        if not state.serves(req.model):
            raise unknown_model(req.model)
        chat = chat_request(req)
        params = sampling_params(chat, state.max_model_len)
        constraint = text_constraint(req.text)
        if constraint is not None:
            params = msgspec.structs.replace(params, constraint=constraint)
        forms = [{"messages": chat_messages(chat)}]
    except ApiError as exc:
        record.finish("rejected")
        return renamed(exc).response()
    rid = uuid.uuid4().hex
    shaper = ResponsesShaper(state, req, rid)
    open_events = partial(engine_events, state.client, forms, params, rid, record)
    if req.stream:
        return LiveStream(request, open_events, shaper, True, record)
    async with open_events() as events:
        done, result = await until_disconnect(request, shaper.collect, events)
    if isinstance(result, ApiError):
        return result.response()
    return JSONResponse(result) if done else Response(status_code=499)


def event_frame(event: dict) -> bytes:
    """One SSE event with an `event:` line naming its type, as OpenAI sends them."""
    return b"event: " + event["type"].encode() + b"\n" + frame(event)


class ResponsesShaper:
    """Turns one request's engine events into a Response object or its stream of events."""

    def __init__(self, state: GatewayState, req: ResponsesRequest, rid: str):
        self.state, self.settings = state, echo(req)
        self.id, self.item_id = "resp_" + rid, "msg_" + rid
        self.created_at = int(time.time())

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        """The HTTP error for a request the engine refused or did not finish."""
        return renamed(engine_error(event, chat=True))

    def response(self, status: str, output: list[dict], usage: Usage | None = None, error: dict | None = None) -> dict:
        """The Response object; status in_progress, completed, incomplete or failed."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.state.model_name,
            "output": output,
            "usage": usage_body(usage) if usage else None,
            **self.settings,
        }

    def message(self, text: str | None, status: str) -> dict:
        """The assistant's output message item; text None: no content part yet."""
        content = [] if text is None else [output_text(text)]
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    async def collect(self, events: AsyncIterator[ClientEvent]) -> dict | ApiError:
        """The whole Response of a non-streamed request, or the error it ended with."""
        text = []
        async for event in events:
            if isinstance(event, Delta):
                text.append(event.text)
            elif isinstance(event, Finished):
                status = final_status(event)
                return self.response(status, [self.message("".join(text), status)], event.usage)
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    async def stream(self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool) -> AsyncIterator[bytes]:
        """The SSE events of a streamed request from its first output on (see the module
        docstring for their order); `usage` is unused: the final Response always has it."""
        seq = count()

        def emit(type: str, **body: Any) -> bytes:
            return event_frame({"type": type, "sequence_number": next(seq), **body})

        at = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        yield emit("response.created", response=self.response("in_progress", []))
        yield emit("response.in_progress", response=self.response("in_progress", []))
        yield emit("response.output_item.added", output_index=0, item=self.message(None, "in_progress"))
        yield emit("response.content_part.added", **at, part=output_text(""))
        text, event = [], first
        while True:
            if isinstance(event, Delta) and event.text:
                text.append(event.text)
                yield emit("response.output_text.delta", **at, delta=event.text, logprobs=[])
            elif isinstance(event, Finished):
                whole, status = "".join(text), final_status(event)
                yield emit("response.output_text.done", **at, text=whole, logprobs=[])
                yield emit("response.content_part.done", **at, part=output_text(whole))
                item = self.message(whole, status)
                yield emit("response.output_item.done", output_index=0, item=item)
                yield emit("response.completed" if status == "completed" else "response.incomplete", response=self.response(status, [item], event.usage))
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                failure = {"code": "server_error", "message": self.error(event).message}
                yield emit("response.failed", response=self.response("failed", [self.message("".join(text), "incomplete")], error=failure))
                return
            event = await events.__anext__()


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def final_status(event: Finished) -> str:
    """completed, or incomplete when the generation stopped at max_output_tokens."""
    return "incomplete" if event.finish_reasons and event.finish_reasons[0] == "length" else "completed"


def usage_body(u: Usage) -> dict:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }

