"""The progress of one generation request as its engine events pass (prompt size, when the
first and last tokens came, the ids generated), and llama-server's `timings` made from it:
for the shapers that report durations (Ollama, llama-server, OpenAI's with timings_per_token).
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from zinfer.messages.client import ClientEvent, Delta, Finished, Started

Events = AsyncGenerator[ClientEvent, None]
OpenEvents = Callable[[], AbstractAsyncContextManager[Events]]
"""As gateway/openai_api.py's: opens one HTTP request's engine events."""


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
    generated: int = 0  # tokens of every choice

    def see(self, event: ClientEvent) -> None:
        if isinstance(event, Started):
            self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, Delta) and event.index == 0:
            now = time.perf_counter()
            if event.token_ids:
                self.first_token = self.first_token or now
                self.last_token = now
            self.token_ids.extend(event.token_ids)
        if isinstance(event, Delta):
            self.generated += len(event.token_ids)
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


def timings(p: Progress, completion_tokens: int, prompt_tokens: int, cached: int) -> dict[str, Any]:
    """llama-server's timings of one request (milliseconds)."""
    prompt_ms, predicted_ms = p.prompt_s * 1e3, p.predicted_s * 1e3
    evaluated = max(prompt_tokens - cached, 0)
    # the first token comes with the prompt's evaluation: the rest are the decode steps
    steps = max(completion_tokens - 1, 0)
    return {
        "cache_n": cached,
        "prompt_n": evaluated,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / evaluated if evaluated else 0.0,
        "prompt_per_second": evaluated / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
        "predicted_n": completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps / predicted_ms * 1e3 if predicted_ms > 0 else 0.0,
    }
