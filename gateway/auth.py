"""`--api-key`: an ASGI middleware that wants the key on every path but /health and the page's
scripts, styles and libraries under /static/.

The key travels as `Authorization: Bearer KEY` or `X-Api-Key: KEY` (Anthropic's SDK and
llama-server's clients send that); on the chat page `/` and its websocket `/v1/ws` also
as `?api_key=KEY`, since a browser sets no headers on a page load or a websocket
handshake. Every comparison is constant-time. A refusal is answered in the error shape
of the protocol the path belongs to (gateway/error_shapes.py).
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from zinfer.gateway.error_shapes import shaped_for
from zinfer.gateway.origins import refuse

OPEN_PATHS = frozenset({"/health"})
OPEN_PREFIX = "/static/"  # the page's scripts, styles and vendored libraries: no secrets there
KEY_IN_QUERY = frozenset({"/", "/v1/ws"})


def key_matches(given: str | bytes | None, key: str) -> bool:
    """Whether given is the key, in time independent of both: each side is hashed to 32
    bytes first, so neither the content nor the length of the key shows in the timing."""
    given = given.encode() if isinstance(given, str) else given or b""
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(key.encode()).digest())


def authorized(
    key: str | None, authorization: str | None, query_key: str | None = None, x_api_key: str | None = None
) -> bool:
    """Whether a request with this Authorization header (or X-Api-Key header, or ?api_key
    where taken) has the key.

    No key configured: always. Every way is checked whatever the others gave."""
    if not key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    bearer = token.strip().encode("latin-1", "replace")  # headers are latin-1
    by_header = key_matches(bearer, key) & (scheme.lower() == "bearer")
    by_x_key = key_matches((x_api_key or "").strip().encode("latin-1", "replace"), key) & (x_api_key is not None)
    by_query = key_matches(query_key, key) & (query_key is not None)
    return by_header | by_x_key | by_query


class ApiKeyMiddleware:
    """Refuses HTTP requests and websocket handshakes with a missing or wrong key: 401 in
    the path's protocol's error shape (a handshake gets it as its HTTP response, or a 1008 close)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or scope["path"] in OPEN_PATHS
            or scope["path"].startswith(OPEN_PREFIX)
            or self._authorized(scope)
        ):
            return await self.app(scope, receive, send)
        how = "send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'"
        how += " or add ?api_key=<key>" if scope["path"] in KEY_IN_QUERY else ""
        shape = shaped_for(scope["path"])
        error = shape(401, f"invalid or missing API key: {how}", type="authentication_error", code="invalid_api_key")
        await refuse(error, scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        query_key = QueryParams(scope["query_string"]).get("api_key") if scope["path"] in KEY_IN_QUERY else None
        headers = Headers(scope=scope)
        return authorized(self.api_key, headers.get("authorization"), query_key, headers.get("x-api-key"))
