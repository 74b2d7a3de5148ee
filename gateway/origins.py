"""What a web page on another site may make this server do: the Host, Origin and CORS policy.

A browser lets any page it shows send requests to 127.0.0.1: websocket handshakes with
no CORS check at all, "simple" cross-origin POSTs (text/plain bodies) with no preflight,
and, after DNS rebinding, same-origin requests to a name the attacker controls. So:

- Host: when bound to a loopback address, only Host localhost, 127.0.0.1 and [::1] (any
  port) and `--allowed-hosts` are served (403 otherwise), as Ollama and Jupyter do. On
  another address the check applies only when `--allowed-hosts` is given.
- Origin: a request that carries one (browsers send it on every websocket handshake and
  cross-origin or non-GET request) is served only from the same origin (its host:port is
  the Host header), a loopback origin (http(s)://localhost, 127.0.0.1, [::1], any port)
  or an `--allowed-origins` entry (`*`: every origin, unsafe). Others get 403; allowed
  ones get CORS headers and their preflights are answered. No Origin (curl, SDKs): no check.
- POST bodies must be JSON: a Content-Type other than application/json gets 415, so a
  simple cross-origin POST never runs. A missing Content-Type is read as JSON (as FastAPI
  does); a browser only omits it for Blob bodies, which carry an Origin checked above.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zinfer.gateway.error_shapes import reshaped, shaped_for
from zinfer.gateway.openai_schema import ApiError

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
LOOPBACK_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})  # urlsplit's hostname has no brackets
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = ("authorization", "content-type")


def is_loopback(bind_host: str) -> bool:
    """Whether `--host` binds a loopback address only (localhost, 127.0.0.0/8, ::1)."""
    name = bind_host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(host: str) -> str:
    """The Host header without its port, lower case: '[::1]:8080' -> '[::1]', 'A.b:80' -> 'a.b'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0]


def parse_origins(text: str | None) -> frozenset[str]:
    """`--allowed-origins a,b`: each '*' or scheme://host[:port]; ValueError names a bad one."""
    out = set()
    for item in (text or "").split(","):
        item = item.strip().lower().rstrip("/")
        if not item:
            continue
        parts = urlsplit(item)
        if item != "*" and (parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query):
            raise ValueError(f"--allowed-origins: {item!r} is not an origin like http://app.example:3000 (or *)")
        out.add(item)
    return frozenset(out)


def parse_hosts(text: str | None) -> frozenset[str]:
    """`--allowed-hosts a,b`: host names (any port), host:port, or '*'."""
    return frozenset(h.strip().lower() for h in (text or "").split(",") if h.strip())


@dataclass(frozen=True)
class OriginPolicy:
    """Which Host values and browser origins are served. The default suits a loopback bind."""

    allowed_origins: frozenset[str] = frozenset()  # beyond same-origin and loopback; "*": all
    allowed_hosts: frozenset[str] | None = frozenset()  # beyond the loopback names; None: no Host check

    @classmethod
    def from_args(cls, bind_host: str, allowed_origins: str | None, allowed_hosts: str | None) -> "OriginPolicy":
        hosts = parse_hosts(allowed_hosts)
        check_hosts = is_loopback(bind_host) or bool(hosts)
        return cls(parse_origins(allowed_origins), hosts if check_hosts else None)

    def host_allowed(self, host: str | None) -> bool:
        if self.allowed_hosts is None or host is None or "*" in self.allowed_hosts:
            return True  # no Host header at all: HTTP/1.0 tools, never a browser
        name = host_name(host)
        return name in LOOPBACK_HOSTS or name in self.allowed_hosts or host.strip().lower() in self.allowed_hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower()
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        try:
            parts = urlsplit(origin)
            hostname = parts.hostname
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not hostname:
            return False  # "null" (sandboxed frames, file://) and anything odd
        return hostname in LOOPBACK_ORIGIN_HOSTS or (host is not None and parts.netloc == host.strip().lower())


async def refuse(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer an HTTP request, or a websocket handshake before it is accepted, with error.

    A handshake gets the error as its HTTP response where the server can send one
    (hypercorn can), else it is closed with 1008 (policy violation). The body is in the
    shape of the path's protocol (OpenAI's, Anthropic's, Ollama's or llama-server's)."""
    if scope["type"] == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
    else:
        await reshaped(error, shaped_for(scope.get("path", ""))).response()(scope, receive, send)


class BrowserGuard:
    """ASGI middleware: the Host and Origin checks, CORS headers and preflight answers."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        if not self.policy.host_allowed(host):
            message = (f"Host {host!r} is not allowed (a DNS rebinding guard); "
                       "start the server with --allowed-hosts to add it")
            error = ApiError(403, message, type="permission_error", code="host_not_allowed")
            return await refuse(error, scope, receive, send)
        if origin is None:
            return await self.app(scope, receive, send)
        if not self.policy.origin_allowed(origin, host):
            message = f"Origin {origin!r} is not allowed; start the server with --allowed-origins to add it"
            error = ApiError(403, message, type="permission_error", code="origin_not_allowed")
            return await refuse(error, scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self.preflight(origin, headers)(scope, receive, send)
        await self.app(scope, receive, with_cors(send, origin))

    def preflight(self, origin: str, headers: Headers) -> Response:
        """204 for a preflight from an allowed origin: any of our methods, with the headers it asks for."""
        asked = [h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",") if h.strip()]
        allow = ", ".join(dict.fromkeys([*CORS_HEADERS, *asked]))
        return Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Allow-Headers": allow,
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )


def with_cors(send: Send, origin: str) -> Send:
    """send, adding Access-Control-Allow-Origin: origin and Vary: Origin to the response start."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers["Access-Control-Allow-Origin"] = origin
            headers.add_vary_header("Origin")
        await send(message)

    return wrapped


class JsonBodiesOnly:
    """ASGI middleware: POSTs with a Content-Type other than application/json get 415."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            given = Headers(scope=scope).get("content-type")
            if given is not None and given.split(";", 1)[0].strip().lower() != "application/json":
                message = f"Content-Type {given!r} is not supported: send the body as 'application/json'"
                return await refuse(ApiError(415, message, code="unsupported_media_type"), scope, receive, send)
        await self.app(scope, receive, send)
