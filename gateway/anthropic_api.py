"""The Anthropic Messages API: `POST /v1/messages` (whole or streamed as typed SSE events)
and `POST /v1/messages/count_tokens`.

A request is checked as a Messages body (gateway/anthropic_schema.py), then runs as the
chat request it translates to, through the chat endpoint's machinery: the same metrics
record, engine events, refusal before the 200, and cancellation when the client leaves
(gateway/openai_api.py). Only the shapes out differ (gateway/anthropic_shaper.py), and
every error is in Anthropic's shape (gateway/error_shapes.py).
"""

from __future__ import annotations

import uuid
from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.anthropic_schema import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    output_constraint,
    renamed,
)
from zinfer.gateway.anthropic_shaper import AnthropicShaper
from zinfer.gateway.client import EngineError
from zinfer.gateway.error_shapes import AnthropicError, reshaped
from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_api import answer, chat_form, constrained, engine_events, generate, read_request, tool_syntax
from zinfer.gateway.openai_schema import ApiError, chat_messages, sampling_params
from zinfer.gateway.openai_tools import tool_plan
from zinfer.gateway.protocol_events import Progress, watched
from zinfer.gateway.state import GatewayState


def routes(state: GatewayState) -> list[Route]:
    async def messages(request: Request) -> Response:
        return await generate(state, request, MessagesRequest, respond)

    async def count_tokens(request: Request) -> Response:
        return await count(state, request)

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]


async def respond(
    state: GatewayState, request: Request, kind: type[MessagesRequest], record: RequestRecord
) -> Response:
    """Validate, then answer whole, or hand back a LiveStream to send (as chat does)."""
    try:
        req = await read_request(state, request, kind)
        chat = chat_request(req)
        plan = tool_plan(chat, tool_syntax(state))
        params = constrained(sampling_params(chat, state.max_model_len, state.sampling), output_constraint(req), plan)
        forms = [chat_form(chat, plan)]
    except ApiError as exc:
        record.finish("rejected")
        return reshaped(renamed(exc), AnthropicError).response()
    rid, progress = uuid.uuid4().hex, Progress()
    constraint_param = "tool_choice" if plan is not None and plan.forced else "output_config.format"
    shaper = AnthropicShaper(state, rid, plan.names if plan else None, params.stop, progress, constraint_param)
    open_events = watched(partial(engine_events, state.engine(), forms, params, rid, record), progress)
    return await answer(request, shaper, open_events, req.stream, True, record)


async def count(state: GatewayState, request: Request) -> Response:
    """{"input_tokens": N}: the prompt the request's system, messages and tools make."""
    try:
        req = await read_request(state, request, CountTokensRequest)
        chat = chat_request(req)
        plan = tool_plan(chat, tool_syntax(state))
        ids = await state.engine().tokenize(messages=chat_messages(chat), tools=plan.functions if plan else None)
    except ApiError as exc:
        return reshaped(renamed(exc), AnthropicError).response()
    except EngineError as exc:
        return AnthropicError(400, str(exc), param="messages").response()
    return JSONResponse({"input_tokens": len(ids)})
