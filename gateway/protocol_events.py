"""What the Anthropic, Ollama and llama-server shapers share beyond gateway/openai_api.py's
machinery: the progress of one request as its events pass (prompt size, when the first
and last tokens came, the ids generated: their timings and durations are made from it),
which stop string ended a text, and NDJSON streaming (Ollama's).
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable

from starlette.responses import Response, StreamingResponse

from zinfer.gateway.client import EngineClient, EngineError
from zinfer.gateway.openai_api import Events, LiveStream, OpenEvents
from zinfer.gateway.sse import SSEResponse
from zinfer.messages.client import ClientEvent, Delta, Finished, Started


@dataclass
class Progress:
    """One request's progress, updated as its events pass (see watched); times are perf_counter seconds."""

    t0: float = field(default_factory=time.perf_counter)  # the request arrived
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    token_ids: list[int] = field(default_factory=list)  # choice 0's generated ids
    text: list[str] = field(default_factory=list)  # choice 0's text as sent

    def see(self, event: ClientEvent) -> None:
        if isinstance(event, Started):
            self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, Delta) and event.index == 0:
            now = time.perf_counter()
            if event.token_ids:
                self.first_token = self.first_token or now
                self.last_token = now
            self.token_ids.extend(event.token_ids)
            self.text.append(event.text)
        elif isinstance(event, Finished):
            self.prompt_tokens = event.usage.prompt_tokens
            self.cached_tokens = event.usage.cached_tokens

    @property
    def prompt_s(self) -> float:
        """From arrival to the first token (the prompt's evaluation, queueing included)."""
        return ((self.first_token or time.perf_counter()) - self.t0)

    @property
    def predicted_s(self) -> float:
        """From the first token to the last."""
        if self.first_token is None or self.last_token is None:
            return 0.0
        return self.last_token - self.first_token


def watched(open_events: OpenEvents, progress: Progress) -> OpenEvents:
    """open_events, with progress seeing every event that passes."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Events]:
        async with open_events() as events:
            passing = _watch(events, progress)
            try:
                yield passing
            finally:
                await passing.aclose()

    return opened


async def _watch(events: Events, progress: Progress) -> Events:
    try:
        async for event in events:
            progress.see(event)
            yield event
    finally:
        await events.aclose()


async def matched_stop(client: EngineClient, progress: Progress, stops: list[str]) -> str | None:
    """The stop string that ended choice 0 (its reason was "stop"), or None when it ended at
    an end-of-generation token: the engine cuts the text before a stop string, so the whole
    decoded text of the ids generated goes on, right after the text sent, with the string."""
    if not stops or not progress.token_ids:
        return None
    try:
        whole = await client.detokenize(progress.token_ids)
    except EngineError:
        return None
    sent = "".join(progress.text)
    rest = whole[len(sent):] if whole.startswith(sent) else whole
    found = [(i, s) for s in stops if (i := rest.find(s)) >= 0]
    return min(found)[1] if found else None


class NDJSONResponse(SSEResponse):
    """An SSEResponse whose frames are JSON lines (application/x-ndjson)."""

    def __init__(self, frames: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]):
        headers = {"Cache-Control": "no-cache"}
        StreamingResponse.__init__(self, frames, media_type="application/x-ndjson", headers=headers)
        self.frames = frames
        self.on_close = on_close


class NDJSONLiveStream(LiveStream):
    """A LiveStream whose 200 body is NDJSON."""

    def body_response(self, frames: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]) -> Response:
        return NDJSONResponse(frames, on_close)
