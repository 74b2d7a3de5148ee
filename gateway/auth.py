"""`--api-key`: an ASGI middleware that wants `Authorization: Bearer KEY` on every path but /health."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from zinfer.gateway.openai_schema import ApiError

OPEN_PATHS = frozenset({"/health"})


class ApiKeyMiddleware:
    """Refuses HTTP requests with a missing or wrong key with 401 in OpenAI's error shape;
    websocket handshakes with a missing or wrong key are closed before they are accepted."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "invalid API key"})
        else:
            error = ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", type="authentication_error", code="invalid_api_key")
            await error.response()(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)
