"""OpenAI's Responses API, `POST /v1/responses`: one generation answered as a Response
object, or streamed as its typed SSE events.

A request is checked as a Responses body (gateway/openai_responses_schema.py), then runs
as the chat request it translates to, through the chat endpoint's machinery: the same
metrics record, engine events, refusal-before-200 and cancellation when the client
leaves (gateway/openai_api.py). Only the shapes out differ, made here by ResponsesShaper.

The output is an assistant message (an output_text part), or, where function tools were
offered, the messages and function_call items the model's text parses into (Hermes
<tool_call> blocks or Llama 3's JSON form, gateway/openai_tools.py); tool_choice
"required" or a named function constrains the text to calls.

The stream is, in order: response.created, response.in_progress, then per message
response.output_item.added, response.content_part.added, response.output_text.delta
(one per text delta), response.output_text.done, response.content_part.done,
response.output_item.done, and per call response.output_item.added,
response.function_call_arguments.delta and .done, response.output_item.done; then
exactly one of response.completed, response.incomplete (max_output_tokens reached) or
response.failed (the engine failed mid-stream). Each event has an `event:` line with its
type and a sequence_number.
"""

from __future__ import annotations

import re
import time
import uuid
from functools import partial
from itertools import count
from typing import Any, AsyncGenerator, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_api import (
    answer,
    chat_form,
    constrained,
    engine_events,
    generate,
    read_request,
    tool_syntax,
)
from zinfer.gateway.openai_responses_schema import ResponsesRequest, chat_request, echo, text_constraint
from zinfer.gateway.openai_schema import ApiError, sampling_params
from zinfer.gateway.openai_shaper import engine_error
from zinfer.gateway.openai_tools import new_call_id, tool_plan
from zinfer.gateway.tool_call_parser import Call, ToolCallParser
from zinfer.gateway.sse import frame
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected, Usage

CHAT_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input"}  # a chat field in an error -> the Responses one
Body = dict[str, Any]
"""A JSON object of the Responses API's shapes (a Response, an output item, a stream event)."""


def routes(state: GatewayState) -> list[Route]:
    async def responses(request: Request) -> Response:
        return await generate(state, request, ResponsesRequest, respond)

    return [Route("/v1/responses", responses, methods=["POST"])]


def renamed(exc: ApiError) -> ApiError:
    """exc with a chat field in `param` renamed to the Responses field it came from
    (tools[i].function.parameters is tools[i].parameters here)."""
    if exc.param:
        exc.param = CHAT_PARAMS.get(exc.param, exc.param)
        exc.param = re.sub(r"^(tools\[\d+\])\.function\.", r"\1.", exc.param)
    return exc


async def respond(
    state: GatewayState, request: Request, kind: type[ResponsesRequest], record: RequestRecord
) -> Response:
    """Validate, then answer whole, or hand back a LiveStream to send (as chat does)."""
    try:
        req = await read_request(state, request, kind)
        chat = chat_request(req)
        plan = tool_plan(chat, tool_syntax(state))
        params = sampling_params(chat, state.max_model_len, state.sampling)
        params = constrained(params, text_constraint(req.text), plan)
        forms = [chat_form(chat, plan)]
    except ApiError as exc:
        record.finish("rejected")
        return renamed(exc).response()
    rid = uuid.uuid4().hex
    constraint_param = "tools" if plan is not None and plan.forced else "text.format"
    shaper = ResponsesShaper(state, req, rid, plan.names if plan else None, constraint_param)
    open_events = partial(engine_events, state.engine(), forms, params, rid, record)
    return await answer(request, shaper, open_events, req.stream, True, record)


def event_frame(event: Body) -> bytes:
    """One SSE event with an `event:` line naming its type, as OpenAI sends them."""
    return b"event: " + str(event["type"]).encode() + b"\n" + frame(event)


class ResponsesShaper:
    """Turns one request's engine events into a Response object or its stream of events.

    `tools`: the names of the functions offered, when the model may call them: its text is
    then parsed into function_call items (gateway/openai_tools.py)."""

    def __init__(
        self,
        state: GatewayState,
        req: ResponsesRequest,
        rid: str,
        tools: set[str] | None,
        constraint_param: str | None = None,
    ):
        self.state, self.settings, self.tools = state, echo(req), tools
        self.constraint_param = constraint_param  # the field a refused grammar came from
        self.id = "resp_" + rid
        self.created_at = int(time.time())

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        """The HTTP error for a request the engine refused or did not finish."""
        return renamed(engine_error(event, chat=True, constraint_param=self.constraint_param))

    def response(self, status: str, output: list[Body], usage: Usage | None = None, error: Body | None = None) -> Body:
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

    async def collect(self, events: AsyncIterator[ClientEvent]) -> Body | ApiError:
        """The whole Response of a non-streamed request, or the error it ended with."""
        output = OutputItems(self.tools)
        async for event in events:
            if isinstance(event, Delta):
                output.feed(event.text)
            elif isinstance(event, Finished):
                status = final_status(event)
                output.finish(status)
                return self.response(status, output.items, event.usage)
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """The SSE events of a streamed request from its first output on (see the module
        docstring for their order); `usage` is unused: the final Response always has it."""
        seq, output, event = count(), OutputItems(self.tools), first

        def frames(*bodies: Body) -> list[bytes]:
            return [event_frame({"type": b.pop("type"), "sequence_number": next(seq), **b}) for b in bodies]

        created = {"type": "response.created", "response": self.response("in_progress", [])}
        for f in frames(created, {"type": "response.in_progress", "response": self.response("in_progress", [])}):
            yield f
        while True:
            if isinstance(event, Delta) and event.text:
                for f in frames(*output.feed(event.text)):
                    yield f
            elif isinstance(event, Finished):
                status = final_status(event)
                done = output.finish(status)
                terminal = "response.completed" if status == "completed" else "response.incomplete"
                final = {"type": terminal, "response": self.response(status, output.items, event.usage)}
                for f in frames(*done, final):
                    yield f
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                failure = {"code": "server_error", "message": self.error(event).message}
                failed = {"type": "response.failed", "response": self.response("failed", output.items, error=failure)}
                for f in frames(failed):
                    yield f
                return
            event = await events.__anext__()


class OutputItems:
    """The output items of one response as its text arrives: assistant messages and, where
    tools were offered, function_call items parsed from the text. feed() and finish()
    return the stream events (without sequence numbers) that announce each change, so a
    streamed response is built by the same steps as a whole one.
    """

    def __init__(self, tools: set[str] | None):
        self.items: list[Body] = []
        self.parser = ToolCallParser(tools) if tools else None
        self.text: list[str] | None = None  # the open message's text, while one is open

    def feed(self, text: str) -> list[Body]:
        pieces = self.parser.feed(text) if self.parser else [text]
        return [e for p in pieces for e in self.add(p)]

    def finish(self, status: str) -> list[Body]:
        """Events for what was held back and for closing the last item; a response that
        made no item gets an empty message."""
        events = [e for p in (self.parser.finish() if self.parser else []) for e in self.add(p)]
        if not self.items:
            events += self.open_message()
        return events + self.close_message("incomplete" if status == "incomplete" else "completed")

    def add(self, piece: str | Call) -> list[Body]:
        """Events for a piece of content (appended to the open message, or a new one) or a call."""
        if piece == "":
            return []
        if isinstance(piece, str):
            events = self.open_message() if self.text is None else []
            assert self.text is not None  # open_message opened one
            self.text.append(piece)
            return events + [{"type": "response.output_text.delta", **self.at(), "delta": piece, "logprobs": []}]
        events = self.close_message("completed")
        item = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "call_id": new_call_id(), "name": piece.name,
                "arguments": "", "status": "in_progress"}
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item)})
        at = {"item_id": item["id"], "output_index": len(self.items) - 1}
        item.update(arguments=piece.arguments, status="completed")
        return events + [
            {"type": "response.function_call_arguments.delta", **at, "delta": piece.arguments},
            {"type": "response.function_call_arguments.done", **at, "arguments": piece.arguments},
            {"type": "response.output_item.done", "output_index": at["output_index"], "item": dict(item)},
        ]

    def at(self) -> Body:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def open_message(self) -> list[Body]:
        self.text = []
        item = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}
        self.items.append(item)
        return [
            {"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item, content=[])},
            {"type": "response.content_part.added", **self.at(), "part": output_text("")},
        ]

    def close_message(self, status: str) -> list[Body]:
        if self.text is None:
            return []
        whole, self.text = "".join(self.text), None
        item = self.items[-1]
        item.update(status=status, content=[output_text(whole)])
        return [
            {"type": "response.output_text.done", **self.at(), "text": whole, "logprobs": []},
            {"type": "response.content_part.done", **self.at(), "part": output_text(whole)},
            {"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": dict(item)},
        ]


def output_text(text: str) -> Body:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def final_status(event: Finished) -> str:
    """completed, or incomplete when the generation stopped at max_output_tokens."""
    return "incomplete" if event.finish_reasons and event.finish_reasons[0] == "length" else "completed"


def usage_body(u: Usage) -> Body:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }
