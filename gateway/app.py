"""The ASGI application of `zinfer serve`: OpenAI-compatible HTTP, websocket chat, chat page."""

from __future__ import annotations

from starlette.applications import Starlette

from zinfer.gateway import openai_api, websocket
from zinfer.gateway.state import GatewayState


def build_app(state: GatewayState) -> Starlette:
    return Starlette(routes=[*openai_api.routes(state), *websocket.routes(state)])
