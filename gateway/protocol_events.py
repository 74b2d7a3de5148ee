"""What the Anthropic, Ollama and llama-server shapers share beyond gateway/openai_api.py's
machinery: which stop string ended a text, and NDJSON streaming (Ollama's). Progress and
watched (gateway/progress.py) are re-exported here.
"""

from __future__ import annotations

from typing import AsyncGenerator, Awaitable, Callable

from starlette.responses import Response, StreamingResponse

from zinfer.gateway.client import EngineClient, EngineError
from zinfer.gateway.openai_api import LiveStream
from zinfer.gateway.progress import Progress, watched
from zinfer.gateway.sse import SSEResponse

__all__ = ["NDJSONLiveStream", "NDJSONResponse", "Progress", "matched_stop", "watched"]


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
