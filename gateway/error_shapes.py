"""Each protocol's error body, for the same ApiError (status, message, field, code):

- OpenAI (ApiError itself): {"error": {"message", "type", "param", "code"}}
- Anthropic: {"type": "error", "error": {"type": "invalid_request_error", "message": "field: ..."}}
- Ollama: {"error": "field: ..."}
- llama-server's native routes: {"error": {"code": 400, "message", "type"}}

Anthropic and Ollama carry no field of their own for the parameter, so the message names
it. `shaped_for(path)` tells which shape a path answers in, for the errors raised before a
route runs (a missing key, an unknown path).
"""

from __future__ import annotations

from typing import Any

from zinfer.gateway.openai_schema import ApiError

ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
    503: "overloaded_error",
}
LLAMA_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    429: "unavailable_error", 501: "not_supported_error", 503: "unavailable_error",
}
LLAMA_PATHS = frozenset({"/completion", "/infill", "/apply-template", "/props", "/slots"})


def _named(exc: ApiError) -> str:
    """The message, led by the field it is about when the message does not name it."""
    if exc.param and exc.param not in exc.message:
        return f"{exc.param}: {exc.message}"
    return exc.message


class AnthropicError(ApiError):
    """An ApiError answered in the Anthropic Messages API's error shape."""

    def body(self) -> dict[str, Any]:
        kind = ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": _named(self)}}


class OllamaError(ApiError):
    """An ApiError answered in Ollama's error shape."""

    def body(self) -> dict[str, Any]:
        return {"error": _named(self)}


class LlamaServerError(ApiError):
    """An ApiError answered in llama-server's native error shape."""

    def body(self) -> dict[str, Any]:
        kind = LLAMA_TYPES.get(self.status, "server_error")
        return {"error": {"code": self.status, "message": _named(self), "type": kind}}


def reshaped(exc: ApiError, shape: type[ApiError]) -> ApiError:
    """exc as `shape` answers it (the same status, message, field and code)."""
    if type(exc) is shape:
        return exc
    return shape(exc.status, exc.message, exc.type, exc.param, exc.code, **exc.extra)


def shaped_for(path: str) -> type[ApiError]:
    """The error class of the protocol a request path belongs to."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return AnthropicError
    if path.startswith("/api/"):
        return OllamaError
    if path in LLAMA_PATHS:
        return LlamaServerError
    return ApiError
