"""The Anthropic Messages API's response shapes for one generation: engine events in, a
Message object or its typed stream events out.

The stream is message_start, then per content block content_block_start, its deltas
(text_delta for text; one input_json_delta with the whole input for a tool_use) and
content_block_stop, then message_delta (stop_reason, stop_sequence and the usage) and
message_stop; a failure after the first event ends it with one `error` event. Streamed
and whole answers are made by the same steps (ContentBlocks), so the events accumulate to
the whole Message.

stop_reason: "max_tokens" at the limit, "tool_use" when the text held tool calls,
"stop_sequence" when a stop sequence ended it (named in stop_sequence), else "end_turn".
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncGenerator, AsyncIterator

from zinfer.gateway.anthropic_schema import renamed
from zinfer.gateway.error_shapes import AnthropicError, reshaped
from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.openai_shaper import engine_error
from zinfer.gateway.protocol_events import Progress, matched_stop
from zinfer.gateway.sse import frame
from zinfer.gateway.state import GatewayState
from zinfer.gateway.tool_call_parser import Call, ToolCallParser
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected, Usage

Body = dict[str, Any]
"""A JSON object of the Messages API's shapes (a Message, a content block, a stream event)."""


def event_frame(event: Body) -> bytes:
    """One SSE event with an `event:` line naming its type, as Anthropic sends them."""
    return b"event: " + str(event["type"]).encode() + b"\n" + frame(event)


def usage_body(u: Usage) -> Body:
    """Anthropic's usage: input_tokens are those not read from the cache (cache_read_input_tokens)."""
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def tool_input(arguments: str) -> Body:
    """A call's arguments (JSON text) as a tool_use block's input object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class ContentBlocks:
    """The content blocks of one message as its text arrives: text blocks and, where tools
    were offered, tool_use blocks parsed from the text. feed() and finish() return the
    stream events for each change."""

    def __init__(self, tools: set[str] | None):
        self.blocks: list[Body] = []
        self.parser = ToolCallParser(tools) if tools else None
        self.open = False  # the last block is a text block still taking text
        self.calls = 0

    def feed(self, text: str) -> list[Body]:
        pieces = self.parser.feed(text) if self.parser else [text]
        return [e for p in pieces for e in self.add(p)]

    def finish(self) -> list[Body]:
        events = [e for p in (self.parser.finish() if self.parser else []) for e in self.add(p)]
        return events + self.close()

    def add(self, piece: str | Call) -> list[Body]:
        if piece == "":
            return []
        if isinstance(piece, str):
            events = [] if self.open else self.start({"type": "text", "text": ""})
            self.open = True
            self.blocks[-1]["text"] += piece
            return events + [{"type": "content_block_delta", "index": len(self.blocks) - 1,
                              "delta": {"type": "text_delta", "text": piece}}]
        self.calls += 1
        events = self.close()
        block_id = "toolu_" + uuid.uuid4().hex[:24]
        events += self.start({"type": "tool_use", "id": block_id, "name": piece.name, "input": {}})
        given = tool_input(piece.arguments)
        self.blocks[-1]["input"] = given
        partial = json.dumps(given, ensure_ascii=False)
        delta = {"type": "content_block_delta", "index": len(self.blocks) - 1,
                 "delta": {"type": "input_json_delta", "partial_json": partial}}
        return events + [delta, {"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def start(self, block: Body) -> list[Body]:
        self.blocks.append(block)
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}]

    def close(self) -> list[Body]:
        if not self.open:
            return []
        self.open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]


class AnthropicShaper:
    """Turns one request's engine events into a Message or its stream of events."""

    def __init__(
        self,
        state: GatewayState,
        rid: str,
        tools: set[str] | None,
        stops: list[str],
        progress: Progress,
        constraint_param: str | None = None,
    ):
        self.state, self.tools, self.stops, self.progress = state, tools, stops, progress
        self.constraint_param = constraint_param
        self.id = "msg_" + rid

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        return reshaped(renamed(engine_error(event, chat=True, constraint_param=self.constraint_param)), AnthropicError)

    def message(self, content: list[Body], stop_reason: str | None, stop_sequence: str | None, usage: Body) -> Body:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.state.model_name,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    async def stop(self, event: Finished, blocks: ContentBlocks) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of a finished message."""
        reason = event.finish_reasons[0] if event.finish_reasons else "stop"
        if reason == "length":
            return "max_tokens", None
        if blocks.calls:
            return "tool_use", None
        matched = await matched_stop(self.state.engine(), self.progress, self.stops)
        return ("stop_sequence", matched) if matched is not None else ("end_turn", None)

    async def collect(self, events: AsyncIterator[ClientEvent]) -> Body | ApiError:
        blocks = ContentBlocks(self.tools)
        async for event in events:
            if isinstance(event, Delta) and event.index == 0:
                blocks.feed(event.text)
            elif isinstance(event, Finished):
                blocks.finish()
                reason, sequence = await self.stop(event, blocks)
                return self.message(blocks.blocks, reason, sequence, usage_body(event.usage))
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """The typed events of a streamed message from its first output on (usage: always sent)."""
        blocks, event = ContentBlocks(self.tools), first
        start = self.message([], None, None, {"input_tokens": self.progress.prompt_tokens, "output_tokens": 0,
                                              "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
        yield event_frame({"type": "message_start", "message": start})
        while True:
            if isinstance(event, Delta) and event.index == 0 and event.text:
                for e in blocks.feed(event.text):
                    yield event_frame(e)
            elif isinstance(event, Finished):
                for e in blocks.finish():
                    yield event_frame(e)
                reason, sequence = await self.stop(event, blocks)
                yield event_frame({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": usage_body(event.usage)})
                yield event_frame({"type": "message_stop"})
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                yield event_frame(self.error(event).body())
                return
            event = await events.__anext__()
