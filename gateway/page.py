"""The chat page's other routes: its modules, styles and vendored libraries under
/static/, and the per-answer trace download.

- GET /static/<file>: the files of gateway/static/ and static/vendor/ (chat.html is
  served as / by gateway/websocket.py); nothing else, and no secrets, so no key is asked.
- GET /v1/traces: {"enabled": bool}, whether this server traces (`--trace-dir`); the page
  shows trace links only when it does.
- GET /v1/traces/<request id>: that request's spans as Perfetto-loadable JSON (a
  download): every slice of the server's trace during that request (traces/request_trace.py);
  404 when tracing is off or no trace file has the request.
  The websocket's ids are taken as the page knows them (without the `ws<N>.` prefix).
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.state import GatewayState
from zinfer.traces.request_trace import request_trace

STATIC = Path(__file__).parent / "static"
TYPES = {".js": "text/javascript", ".css": "text/css"}  # the rest (README, licenses) as text/plain


def static_files() -> dict[str, Path]:
    """URL path under /static/ -> file, for every file the page may load."""
    listed = [*STATIC.iterdir(), *(STATIC / "vendor").iterdir()]
    files = [p for p in listed if p.is_file() and p.name != "chat.html"]
    return {p.relative_to(STATIC).as_posix(): p for p in files}


def routes(state: GatewayState) -> list[BaseRoute]:
    files = static_files()

    async def static(request: Request) -> Response:
        path = files.get(request.path_params["name"])
        if path is None:
            return ApiError(404, f"GET {request.url.path}: no such file", code="not_found").response()
        media = TYPES.get(path.suffix, "text/plain")
        return Response(path.read_bytes(), media_type=f"{media}; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    async def tracing(request: Request) -> Response:
        return JSONResponse({"enabled": bool(state.extra.get("trace_dir"))})

    async def one_trace(request: Request) -> Response:
        rid = request.path_params["request_id"]
        trace_dir = state.extra.get("trace_dir")
        if not trace_dir:
            return ApiError(404, "tracing is off: start zinfer serve with --trace-dir", code="not_found").response()
        doc = await trio.to_thread.run_sync(request_trace, trace_dir, rid, state.extra.get("trace_window") or 60.0)
        if doc is None:
            missing = f"no trace of request {rid!r} in {trace_dir} (unknown, or not finished)"
            return ApiError(404, missing, code="not_found").response()
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in rid)[:80]
        return Response(json.dumps(doc, separators=(",", ":")), media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="zinfer-trace-{name}.json"'})

    return [
        Route("/static/{name:path}", static, methods=["GET"]),
        Route("/v1/traces", tracing, methods=["GET"]),
        Route("/v1/traces/{request_id}", one_trace, methods=["GET"]),
    ]
