"""The ASGI application of `zinfer serve`: OpenAI-compatible HTTP, websocket chat, chat page,
and the operational routes /health and /metrics.

/health answers before the engine is ready (503 {"status": "loading"}, then 200), and
needs no API key. Unknown paths and methods get OpenAI-shaped errors too. What a page
on another site may make the server do (Host, Origin, CORS, body types) is decided in
gateway/origins.py.
"""

from __future__ import annotations

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from zinfer.gateway import (
    anthropic_api,
    llama_server_api,
    ollama_api,
    openai_api,
    openai_responses,
    page,
    replica_admin,
    tokenize_api,
    websocket,
)
from zinfer.gateway.auth import ApiKeyMiddleware
from zinfer.gateway.client import EngineError
from zinfer.gateway.error_shapes import shaped_for
from zinfer.gateway.origins import BrowserGuard, JsonBodiesOnly
from zinfer.gateway.state import GatewayState

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def build_app(state: GatewayState) -> Starlette:
    async def health(request: Request) -> Response:
        if not state.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        stats = None
        if state.client is not None:  # ready
            with trio.move_on_after(2.0):
                try:
                    stats = await state.client.stats()
                except EngineError:
                    pass
        return PlainTextResponse(state.metrics.render(stats), media_type=PROMETHEUS_TEXT)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
        shape = shaped_for(request.url.path)  # Anthropic's, Ollama's, llama-server's or OpenAI's error body
        return shape(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=kind).response()

    # outermost first: Host and Origin (preflights need no key), then the key, then the body's type
    keyed = [Middleware(ApiKeyMiddleware, api_key=state.api_key)] if state.api_key else []
    middleware = [Middleware(BrowserGuard, policy=state.origins), *keyed, Middleware(JsonBodiesOnly)]
    operational = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
    api: list[BaseRoute] = [*openai_api.routes(state), *tokenize_api.routes(state), *openai_responses.routes(state)]
    api += [*websocket.routes(state), *page.routes(state)]
    # the other protocols (gateway/PROTOCOL.md)
    api += [*anthropic_api.routes(state), *ollama_api.routes(state), *llama_server_api.routes(state)]
    api += replica_admin.routes(state)  # /admin/replicas: scale-down for autoscalers (serve --replicas)
    return Starlette(
        routes=[*operational, *api],
        middleware=middleware,
        # Starlette types a handler as taking any Exception; it calls this one with HTTPExceptions only
        exception_handlers={HTTPException: http_error},  # type: ignore[dict-item]
    )
