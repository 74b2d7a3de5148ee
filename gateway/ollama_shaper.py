"""Ollama's response shapes for one generation: engine events in, one JSON object or its
NDJSON stream out, for /api/chat (`message`) and /api/generate (`response`).

A stream is one line per text piece ({"done": false}), a line per tool call the text
parses into (chat, with tools), and a last line with "done": true, done_reason (stop or
length) and the counts and durations (nanoseconds) Ollama reports; a failure after the
first line ends it with an {"error": ...} line. Whole and streamed answers are made by the
same steps, so the lines concatenate to the whole answer.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, AsyncGenerator, AsyncIterator

import msgspec

from zinfer.gateway.error_shapes import OllamaError, reshaped
from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.openai_shaper import engine_error
from zinfer.gateway.protocol_events import Progress
from zinfer.gateway.tool_call_parser import Call, ToolCallParser
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected

Body = dict[str, Any]


def created_at() -> str:
    """Now as Ollama writes it: RFC 3339 in UTC with fractional seconds."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def line(obj: Body) -> bytes:
    return msgspec.json.encode(obj) + b"\n"


def call_body(call: Call) -> Body:
    """One tool call as Ollama writes it: the arguments as an object."""
    try:
        arguments = msgspec.json.decode(call.arguments)
    except msgspec.DecodeError:
        arguments = {"arguments": call.arguments}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return {"function": {"name": call.name, "arguments": arguments}}


class OllamaShaper:
    """Turns one request's engine events into an Ollama answer or its NDJSON lines."""

    def __init__(
        self,
        model: str,
        chat: bool,
        tools: set[str] | None,
        progress: Progress,
        constraint_param: str | None = None,
    ):
        self.model, self.chat, self.progress = model, chat, progress
        self.tools, self.constraint_param = tools, constraint_param

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        return reshaped(engine_error(event, chat=self.chat, constraint_param=self.constraint_param), OllamaError)

    def body(self, text: str, calls: list[Call], done: bool) -> Body:
        out: Body = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: Body = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [call_body(c) for c in calls]
            out["message"] = message
        else:
            out["response"] = text
        out["done"] = done
        return out

    def final(self, event: Finished, text: str = "", calls: list[Call] | None = None) -> Body:
        p, now = self.progress, time.perf_counter()
        reason = event.finish_reasons[0] if event.finish_reasons else "stop"
        return {
            **self.body(text, calls or [], True),
            "done_reason": "length" if reason == "length" else "stop",
            "total_duration": int((now - p.t0) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": event.usage.prompt_tokens,
            "prompt_eval_duration": int(p.prompt_s * 1e9),
            "eval_count": event.usage.completion_tokens,
            "eval_duration": int(p.predicted_s * 1e9),
        }

    def pieces(self, parser: ToolCallParser | None, text: str, end: bool = False) -> list[str | Call]:
        if parser is None:
            return [text] if text else []
        return parser.feed(text) + (parser.finish() if end else [])

    async def collect(self, events: AsyncIterator[ClientEvent]) -> Body | ApiError:
        parser = ToolCallParser(self.tools) if self.tools else None
        got: list[str | Call] = []
        async for event in events:
            if isinstance(event, Delta) and event.index == 0:
                got += self.pieces(parser, event.text)
            elif isinstance(event, Finished):
                got += self.pieces(parser, "", end=True)
                text = "".join(p for p in got if isinstance(p, str))
                return self.final(event, text, [p for p in got if isinstance(p, Call)])
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """NDJSON lines from the first output on (usage: always in the last line)."""
        parser = ToolCallParser(self.tools) if self.tools else None
        event = first
        while True:
            if isinstance(event, Delta) and event.index == 0 and event.text:
                for p in self.pieces(parser, event.text):
                    yield line(self.body(p, [], False) if isinstance(p, str) else self.body("", [p], False))
            elif isinstance(event, Finished):
                for p in self.pieces(parser, "", end=True):
                    yield line(self.body(p, [], False) if isinstance(p, str) else self.body("", [p], False))
                yield line(self.final(event))
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                yield line(self.error(event).body())
                return
            event = await events.__anext__()
