"""Server-sent events over a plain StreamingResponse, and noticing clients that leave.

sse-starlette's graceful drain does nothing under trio, and Starlette's own
StreamingResponse cannot be used as is here either: its disconnect listener cancels
through anyio, whose trio backend (anyio 4.16) calls CancelScope.cancel(reason), which
trio 0.22 does not take. So SSEResponse runs the frames and the listener in a trio
nursery itself: when http.disconnect arrives, the frames generator is cancelled.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, Awaitable, Callable, TypeVar

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def frame(obj: Any) -> bytes:
    """One SSE event carrying obj as JSON."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class SSEResponse(StreamingResponse):
    """Streams SSE frames; `on_close` runs however the stream ends (done, error, client gone).

    on_close also runs when the client leaves before the first frame was asked for, when
    the frames generator never started and so cannot clean up after itself.
    """

    def __init__(self, frames: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(frames, media_type="text/event-stream", headers=headers)
        self.frames = frames  # the body_iterator itself, typed as the generator it is
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with trio.open_nursery() as nursery:

                async def stream() -> None:
                    await self.stream_response(send)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stream)
                await self.listen_for_disconnect(receive)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.frames.aclose()
                await self.on_close()


async def until_disconnect(request: Request, fn: Callable[..., Awaitable[T]], *args: Any) -> tuple[bool, T | None]:
    """Run fn(*args) unless the client disconnects first; returns (completed, result).

    When the client leaves, fn is cancelled (an engine stream inside it cancels its
    request). Call only once the request body has been read.
    """
    result: list[T] = []

    async def watch(scope: trio.CancelScope) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        result.append(await fn(*args))
        nursery.cancel_scope.cancel()
    return (True, result[0]) if result else (False, None)
