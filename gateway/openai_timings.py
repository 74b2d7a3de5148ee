"""llama-server's `timings` on the OpenAI routes, when a request asks with
`"timings_per_token": true`: the whole response gets a `timings` object (gateway/progress.py's,
as /completion answers it), and a stream one last chunk with no choices and the timings
before `data: [DONE]`, as the usage chunk comes."""

from __future__ import annotations

from typing import Any, AsyncGenerator, AsyncIterator

import msgspec

from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.progress import Progress, timings
from zinfer.gateway.sse import DONE, frame
from zinfer.messages.client import Cancelled, ClientEvent, Failed, Rejected


class TimedShaper:
    """A ReplyShaper (gateway/openai_api.py) whose replies carry timings from `progress`
    (which must watch the same events: gateway/progress.py's watched)."""

    def __init__(self, shaper: Any, progress: Progress):
        self.shaper, self.progress = shaper, progress

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        error: ApiError = self.shaper.error(event)
        return error

    def timings(self) -> dict[str, Any]:
        p = self.progress
        return timings(p, p.generated, p.prompt_tokens, p.cached_tokens)

    async def collect(self, events: AsyncIterator[ClientEvent]) -> dict[str, Any] | ApiError:
        result: dict[str, Any] | ApiError = await self.shaper.collect(events)
        if isinstance(result, dict):
            result["timings"] = self.timings()
        return result

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        first_frame: dict[str, Any] | None = None
        async for f in self.shaper.stream(first, events, usage):
            if f == DONE and first_frame is not None:
                chunk = {k: first_frame.get(k) for k in ("id", "object", "created", "model", "system_fingerprint")}
                yield frame({**chunk, "choices": [], "timings": self.timings()})
            elif first_frame is None and f.startswith(b"data: {"):
                first_frame = msgspec.json.decode(f[6:])
            yield f
