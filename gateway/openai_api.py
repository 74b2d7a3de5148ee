"""OpenAI-compatible HTTP routes: chat and text completions (streamed or not), models,
and llama-server's /tokenize and /detokenize.

A generation's status is decided by its first event from the engine: a rejection
(too long: 400, queue full: 429, ...) is answered as an OpenAI error even when the
client asked to stream; otherwise a stream's 200 and headers go out with the first
token. A client that leaves, before or during the stream, cancels its engine request.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.client import EngineError
from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_schema import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    chat_messages,
    completion_prompt,
    include_usage,
    parse,
    sampling_params,
)
from zinfer.gateway.sse import DONE, SSEResponse, frame, until_disconnect
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected, Started, Text, TokenIds, Usage

ENGINE_PARAMS = {"logit_bias": "logit_bias", "stop_token_ids": "stop_token_ids", "prompt_ids": "prompt"}  # first word of an engine message -> param
REJECTION_STATUS = {"too_long": 400, "bad_request": 400, "cannot_fit": 400, "queue_full": 429}


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

    async def tokenize(request: Request) -> Response:
        return await _tokenize(state, request)

    async def detokenize(request: Request) -> Response:
        return await _detokenize(state, request)

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]


def model_card(state: GatewayState) -> dict:
    return {"id": state.model_name, "object": "model", "created": 0, "owned_by": "zinfer", "max_model_len": state.max_model_len}


def unknown_model(name: str) -> ApiError:
    return ApiError(404, f"the model {name!r} does not exist; this server serves its own model only", param="model", code="model_not_found")


def engine_error(event: Rejected | Failed | Cancelled) -> ApiError:
    """The HTTP error for a request the engine did not finish."""
    if isinstance(event, Rejected):
        status = REJECTION_STATUS.get(event.code, 400)
        if event.code == "too_long":
            return ApiError(status, event.message, param="messages", code="context_length_exceeded", n_prompt_tokens=event.n_prompt_tokens, n_ctx=event.n_ctx)
        if event.code == "queue_full":
            return ApiError(status, event.message, type="rate_limit_error", code="queue_full")
        first = event.message.split(" ", 1)[0]
        return ApiError(status, event.message, param=ENGINE_PARAMS.get(first), code=event.code)
    if isinstance(event, Cancelled):
        return ApiError(500, "the request was cancelled", type="server_error", code="cancelled")
    return ApiError(500, event.message, type="server_error", code="engine_failed")


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


async def generate(state: GatewayState, request: Request, kind: type[ChatRequest] | type[CompletionRequest]) -> Response:
    """Serve one chat or text completion request.

    Its metrics record ends on every way out: here (an unexpected exception counts as
    failed), or in the SSE response's on_close once a stream is handed to Starlette.
    """
    record = state.metrics.open()
    response: Response | None = None
    try:
        response = await respond(state, request, kind, record)
        return response
    except Exception:
        record.finish("failed")
        raise
    finally:
        if not isinstance(response, SSEResponse):
            record.close()


async def respond(state: GatewayState, request: Request, kind: type[ChatRequest] | type[CompletionRequest], record: RequestRecord) -> Response:
    """generate()'s work: validate, send to the engine, answer whole or as a stream."""
    try:
        if not state.ready:
            raise ApiError(503, "the model is loading", type="unavailable_error", code="loading")
        req = parse(await read_body(request, state.max_body_bytes), kind)
        if not state.serves(req.model):
            raise unknown_model(req.model)
        params = sampling_params(req, state.max_model_len)
        form = {"messages": chat_messages(req)} if isinstance(req, ChatRequest) else completion_prompt(req)
    except ApiError as exc:
        record.finish("rejected")
        return exc.response()
    rid = uuid.uuid4().hex
    shaper = Shaper(state, isinstance(req, ChatRequest), rid, req.model or state.model_name)
    events = record.observe(state.client.generate(**form, params=params, request_id=rid))
    if not req.stream:
        try:
            done, result = await until_disconnect(request, shaper.collect, events)
        finally:
            await events.aclose()
        if isinstance(result, ApiError):
            return result.response()
        return JSONResponse(result) if done else Response(status_code=499)
    streaming = False
    try:
        done, first = await until_disconnect(request, first_output, events)
        if not done or isinstance(first, (Rejected, Failed, Cancelled)):
            return engine_error(first).response() if done else Response(status_code=499)
        streaming = True
    finally:
        if not streaming:
            await events.aclose()

    async def on_close() -> None:
        await events.aclose()
        record.close()

    return SSEResponse(shaper.stream(first, events, include_usage(req)), on_close)


async def first_output(events: AsyncIterator[ClientEvent]) -> ClientEvent:
    """The first event after Started: a Delta, or a terminal that refuses the request."""
    while True:
        event = await events.__anext__()
        if not isinstance(event, Started):
            return event


class Shaper:
    """Turns one request's engine events into OpenAI chunks or a whole response."""

    def __init__(self, state: GatewayState, chat: bool, rid: str, model: str):
        self.state, self.chat, self.model = state, chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + rid
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())

    def envelope(self, choices: list[dict], chunk: bool, **extra: Any) -> dict:
        obj = self.object + ".chunk" if chunk and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    async def stream(self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool) -> AsyncIterator[bytes]:
        """SSE frames: role chunks (chat), a chunk per delta, the usage chunk if asked, [DONE]."""
        extra = {"usage": None} if usage else {}
        event, started = first, set()
        while True:
            if isinstance(event, Delta) and (event.text or event.finish_reason or event.logprobs):
                if self.chat and event.index not in started:
                    started.add(event.index)
                    yield frame(self.envelope([{"index": event.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}], True, **extra))
                yield frame(self.envelope([await self.choice(event, chunk=True)], True, **extra))
            elif isinstance(event, Finished):
                if usage:
                    yield frame(self.envelope([], True, usage=usage_body(event.usage)))
                yield DONE
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                yield frame(engine_error(event).body())
                yield DONE
                return
            event = await events.__anext__()

    async def collect(self, events: AsyncIterator[ClientEvent]) -> dict | ApiError:
        """The whole response of a non-streamed request, or the error it ended with."""
        choices: dict[int, dict] = {}
        async for event in events:
            if isinstance(event, Delta):
                part = await self.choice(event, chunk=False)
                c = choices.setdefault(event.index, part)
                if c is not part:
                    merge(c, part, self.chat)
            elif isinstance(event, Finished):
                ordered = [choices.get(i) or self.empty(i) for i in range(len(event.finish_reasons))]
                for c, reason in zip(ordered, event.finish_reasons):
                    c["finish_reason"] = reason
                return self.envelope(ordered, False, usage=usage_body(event.usage))
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return engine_error(event)
        return engine_error(Failed("", "the engine stream ended early"))

    def empty(self, index: int) -> dict:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return {"index": index, "text": "", "logprobs": None, "finish_reason": None}

    async def choice(self, d: Delta, chunk: bool) -> dict:
        """One choice object for a delta: a chunk's delta or a response's message."""
        lp = await self.logprobs(d) if d.logprobs is not None else None
        if not self.chat:
            return {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        body = {"content": d.text} if chunk else {"role": "assistant", "content": d.text}
        return {"index": d.index, "delta" if chunk else "message": body, "logprobs": lp, "finish_reason": d.finish_reason}

    async def logprobs(self, d: Delta) -> dict:
        """Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions: the legacy lists."""
        tops = d.top_logprobs or [[] for _ in d.token_ids]
        await self.load_texts([*d.token_ids, *(t.token_id for top in tops for t in top)])
        text = self.state.token_text
        if self.chat:
            entry = lambda tid, lp: {"token": text[tid], "logprob": lp, "bytes": list(text[tid].encode())}  # noqa: E731
            return {"content": [{**entry(t, lp), "top_logprobs": [entry(x.token_id, x.logprob) for x in top]} for t, lp, top in zip(d.token_ids, d.logprobs, tops)]}
        return {
            "tokens": [text[t] for t in d.token_ids],
            "token_logprobs": list(d.logprobs),
            "top_logprobs": [{text[x.token_id]: x.logprob for x in top} for top in tops] if d.top_logprobs else None,
        }

    async def load_texts(self, ids: list[int]) -> None:
        """Make sure state.token_text knows each id (asked of the engine once per id)."""
        for tid in ids:
            if tid not in self.state.token_text:
                self.state.token_text[tid] = await self.state.client.detokenize([tid])


def merge(into: dict, part: dict, chat: bool) -> None:
    """Append a later delta's text and logprobs to a collected choice."""
    if chat:
        into["message"]["content"] += part["message"]["content"]
        if part["logprobs"]:
            into["logprobs"]["content"] += part["logprobs"]["content"]
    else:
        into["text"] += part["text"]
        if part["logprobs"]:
            for key in ("tokens", "token_logprobs"):
                into["logprobs"][key] += part["logprobs"][key]
            if part["logprobs"]["top_logprobs"]:
                into["logprobs"]["top_logprobs"] += part["logprobs"]["top_logprobs"]
    into["finish_reason"] = part["finish_reason"] or into["finish_reason"]


def usage_body(u: Usage) -> dict:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


class TokenizeBody(msgspec.Struct):
    content: Text
    add_special: bool = True


class DetokenizeBody(msgspec.Struct):
    tokens: TokenIds  # 0 <= id < 2**31 here; the engine checks them against the vocabulary


async def _tokenize(state: GatewayState, request: Request) -> Response:
    try:
        body = _decode(await read_body(request, state.max_body_bytes), TokenizeBody, state)
        return JSONResponse({"tokens": await state.client.tokenize(body.content, add_special=body.add_special)})
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return ApiError(400, str(exc)).response()


async def _detokenize(state: GatewayState, request: Request) -> Response:
    try:
        body = _decode(await read_body(request, state.max_body_bytes), DetokenizeBody, state)
        return JSONResponse({"content": await state.client.detokenize(body.tokens)})
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return ApiError(400, str(exc), param="tokens").response()


def _decode(body: bytes, kind: type, state: GatewayState):
    if not state.ready:
        raise ApiError(503, "the model is loading", type="unavailable_error", code="loading")
    return parse(body, kind)
