"""/tokenize and /detokenize (vLLM's and llama-server's): a text or chat to token ids (with
llama-server's pieces if asked) and ids back to text, through the engine's own tokenizer."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.client import EngineError
from zinfer.gateway.infill_prompt import facts
from zinfer.gateway.openai_api import read_body
from zinfer.gateway.openai_schema import ApiError, parse
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Text, TokenIds

Parsed = TypeVar("Parsed")


def routes(state: GatewayState) -> list[Route]:
    async def tokenize_route(request: Request) -> Response:
        return await tokenize(state, request)

    async def detokenize_route(request: Request) -> Response:
        return await detokenize(state, request)

    return [
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
    ]


class TokenizeBody(msgspec.Struct):
    content: Text
    add_special: bool = True
    with_pieces: bool = False  # llama-server's: [{"id", "piece"}] (a piece not whole UTF-8: its bytes)
    parse_special: bool = True  # special tokens' texts are always read as those tokens: false is refused


class DetokenizeBody(msgspec.Struct):
    tokens: TokenIds  # 0 <= id < 2**31 here; the engine checks them against the vocabulary


async def tokenize(state: GatewayState, request: Request) -> Response:
    try:
        body = _decode(await read_body(request, state.max_body_bytes), TokenizeBody, state)
        if not body.parse_special:
            raise ApiError(400, "parse_special false is not supported: special tokens' texts are always parsed",
                           param="parse_special")
        ids = await state.engine().tokenize(body.content, add_special=body.add_special)
        if body.with_pieces:
            model = facts(state)
            return JSONResponse({"tokens": [{"id": t, "piece": model.piece(t)} for t in ids]})
        return JSONResponse({"tokens": ids})
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return ApiError(400, str(exc)).response()


async def detokenize(state: GatewayState, request: Request) -> Response:
    try:
        body = _decode(await read_body(request, state.max_body_bytes), DetokenizeBody, state)
        return JSONResponse({"content": await state.engine().detokenize(body.tokens)})
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return ApiError(400, str(exc), param="tokens").response()


def _decode(body: bytes, kind: type[Parsed], state: GatewayState) -> Parsed:
    state.engine()  # ApiError 503 while the model loads
    return parse(body, kind)
