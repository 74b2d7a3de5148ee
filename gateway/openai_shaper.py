"""OpenAI's response shapes for one generation: engine events in, chunks or a whole
response out (gateway/openai_api.py routes the requests), and the HTTP error for a
request the engine refused or could not finish."""

from __future__ import annotations

import time
from typing import Any, AsyncGenerator, AsyncIterator

from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.openai_tools import StreamedCalls, ToolPlan, unfinished_call, with_tool_calls
from zinfer.gateway.sse import DONE, frame
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected, Usage

ENGINE_PARAMS = {  # the first word of an engine message -> the request param it is about
    "logit_bias": "logit_bias", "stop_token_ids": "stop_token_ids", "prompt_ids": "prompt", "max_tokens": "max_tokens",
}
REJECTION_STATUS = {"too_long": 400, "bad_request": 400, "bad_constraint": 400, "cannot_fit": 400, "queue_full": 429}
Body = dict[str, Any]
"""A JSON object of OpenAI's response shapes (a response, a choice, a delta, logprobs)."""


def engine_error(event: Rejected | Failed | Cancelled, chat: bool, constraint_param: str | None = None) -> ApiError:
    """The HTTP error for a request the engine did not finish (a too-long prompt names
    `messages` for chat, `prompt` for completions; a refused grammar, constraint_param:
    the request field it came from, also when its grammar failed mid-generation)."""
    if isinstance(event, Rejected):
        status = REJECTION_STATUS.get(event.code, 400)
        if event.code == "bad_constraint":
            return ApiError(status, event.message, param=constraint_param, code="invalid_value")
        if event.code == "too_long":
            param = "messages" if chat else "prompt"
            return ApiError(status, event.message, param=param, code="context_length_exceeded",
                            n_prompt_tokens=event.n_prompt_tokens, n_ctx=event.n_ctx)
        if event.code == "queue_full":
            return ApiError(status, event.message, type="rate_limit_error", code="queue_full")
        first = event.message.split(" ", 1)[0]
        return ApiError(status, event.message, param=ENGINE_PARAMS.get(first), code=event.code)
    if isinstance(event, Cancelled):
        return ApiError(500, "the request was cancelled", type="server_error", code="cancelled")
    if event.code == "bad_constraint":  # its grammar could not be followed: the request's own problem
        return ApiError(400, event.message, param=constraint_param, code="invalid_value")
    return ApiError(500, event.message, type="server_error", code="engine_failed")


class Shaper:
    """Turns one request's engine events into OpenAI chunks or a whole response."""

    def __init__(
        self,
        state: GatewayState,
        chat: bool,
        rid: str,
        tools: ToolPlan | None = None,
        constraint_param: str | None = None,
    ):
        self.state, self.chat = state, chat
        self.constraint_param = constraint_param  # the request field its constraint came from, named in a refusal
        self.tools = tools if chat else None  # the model may call these: its text is parsed for calls
        self.calls = StreamedCalls(self.tools.names) if self.tools else None
        self.id = ("chatcmpl-" if chat else "cmpl-") + rid
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        """The HTTP error for a request the engine refused or did not finish."""
        return engine_error(event, self.chat, self.constraint_param)

    def envelope(self, choices: list[Body], chunk: bool, **extra: Any) -> Body:
        obj = self.object + ".chunk" if chunk and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.state.model_name,
                "system_fingerprint": self.state.system_fingerprint, "choices": choices, **extra}

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """SSE frames: per choice a role chunk (chat), its text chunks (finish_reason null),
        then one chunk with an empty delta carrying its finish_reason; the usage chunk if
        asked; [DONE]."""
        extra = {"usage": None} if usage else {}
        event = first
        started: set[int] = set()  # choices whose role chunk went out (chat)
        ended: set[int] = set()  # choices whose finish_reason went out
        failed: list[ApiError] = []  # a choice's end that ended the stream

        def chunk(index: int, body: Body, logprobs: Body | None = None, finish_reason: str | None = None) -> bytes:
            choice = {"index": index, **body, "logprobs": logprobs, "finish_reason": finish_reason}
            return frame(self.envelope([choice], True, **extra))

        def begin(index: int) -> list[bytes]:
            if not self.chat or index in started:
                return []
            started.add(index)
            return [chunk(index, {"delta": {"role": "assistant", "content": ""}})]

        def end(index: int, reason: str) -> list[bytes]:
            ended.add(index)
            held = [chunk(index, {"delta": body}) for body in self.calls.finish(index)] if self.calls else []
            incomplete = unfinished_call(self.tools, reason, self.calls.sent(index)) if self.calls else None
            if incomplete is not None:  # a compulsory call cut short: the error ends the stream
                failed.append(incomplete)
                return [frame(incomplete.body()), DONE]
            reason = self.calls.reason(index, reason) if self.calls else reason
            last = chunk(index, {"delta": {}} if self.chat else {"text": ""}, finish_reason=reason)
            return [*begin(index), *held, last]

        while True:
            if isinstance(event, Delta):
                if event.text or event.logprobs:
                    for f in begin(event.index):
                        yield f
                    lp = await self.logprobs(event) if event.logprobs is not None else None
                    if self.calls is None:
                        text = {"delta": {"content": event.text}} if self.chat else {"text": event.text}
                        yield chunk(event.index, text, lp)
                    else:  # text that may be a tool call is held back; a call goes out as tool_calls deltas
                        bodies = self.calls.deltas(event.index, event.text) or ([{"content": ""}] if lp else [])
                        for k, body in enumerate(bodies):
                            yield chunk(event.index, {"delta": body}, lp if k == 0 else None)
                if event.finish_reason and event.index not in ended:
                    for f in end(event.index, event.finish_reason):
                        yield f
                    if failed:
                        return
            elif isinstance(event, Finished):
                for i, reason in enumerate(event.finish_reasons):
                    for f in end(i, reason) if i not in ended else []:
                        yield f
                    if failed:
                        return
                if usage:
                    yield frame(self.envelope([], True, usage=usage_body(event.usage)))
                yield DONE
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                yield frame(self.error(event).body())
                yield DONE
                return
            event = await events.__anext__()

    async def collect(self, events: AsyncIterator[ClientEvent]) -> Body | ApiError:
        """The whole response of a non-streamed request, or the error it ended with."""
        choices: dict[int, Body] = {}
        async for event in events:
            if isinstance(event, Delta):
                part = await self.choice(event)
                c = choices.setdefault(event.index, part)
                if c is not part:
                    merge(c, part, self.chat)
            elif isinstance(event, Finished):
                ordered = [choices.get(i) or self.empty(i) for i in range(len(event.finish_reasons))]
                for c, reason in zip(ordered, event.finish_reasons):
                    c["finish_reason"] = reason
                    if self.tools:
                        with_tool_calls(c, self.tools.names)
                        calls = len(c["message"].get("tool_calls") or [])
                        if (incomplete := unfinished_call(self.tools, reason, calls)) is not None:
                            return incomplete
                return self.envelope(ordered, False, usage=usage_body(event.usage))
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    def empty(self, index: int) -> Body:
        if self.chat:
            message = {"role": "assistant", "content": ""}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": None}
        return {"index": index, "text": "", "logprobs": None, "finish_reason": None}

    async def choice(self, d: Delta) -> Body:
        """One choice object of a whole response for a delta."""
        lp = await self.logprobs(d) if d.logprobs is not None else None
        if not self.chat:
            return {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        message = {"role": "assistant", "content": d.text}
        return {"index": d.index, "message": message, "logprobs": lp, "finish_reason": d.finish_reason}

    async def logprobs(self, d: Delta) -> Body:
        """A delta's logprobs (it has them): chat's {"content": [{token, logprob, bytes,
        top_logprobs}]}; completions' legacy lists."""
        tops = d.top_logprobs or [[] for _ in d.token_ids]
        values = d.logprobs or []
        await self.load_texts([*d.token_ids, *(t.token_id for top in tops for t in top)])
        text = self.state.token_text
        if self.chat:

            def entry(tid: int, lp: float) -> Body:
                return {"token": text[tid], "logprob": lp, "bytes": list(text[tid].encode())}

            content = [
                {**entry(t, lp), "top_logprobs": [entry(x.token_id, x.logprob) for x in top]}
                for t, lp, top in zip(d.token_ids, values, tops)
            ]
            return {"content": content}
        return {
            "tokens": [text[t] for t in d.token_ids],
            "token_logprobs": list(values),
            "top_logprobs": [{text[x.token_id]: x.logprob for x in top} for top in tops] if d.top_logprobs else None,
        }

    async def load_texts(self, ids: list[int]) -> None:
        """Make sure state.token_text knows each id (asked of the engine once per id)."""
        for tid in ids:
            if tid not in self.state.token_text:
                self.state.token_text[tid] = await self.state.engine().detokenize([tid])


def merge(into: Body, part: Body, chat: bool) -> None:
    """Append a later delta's text and logprobs to a collected choice."""
    if chat:
        into["message"]["content"] += part["message"]["content"]
        if part["logprobs"]:
            into["logprobs"]["content"] += part["logprobs"]["content"]
    else:
        into["text"] += part["text"]
        if part["logprobs"]:
            for key in ("tokens", "token_logprobs"):
                into["logprobs"][key] += part["logprobs"][key]
            if part["logprobs"]["top_logprobs"]:
                into["logprobs"]["top_logprobs"] += part["logprobs"]["top_logprobs"]
    into["finish_reason"] = part["finish_reason"] or into["finish_reason"]


def usage_body(u: Usage) -> Body:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        # speculative decoding's drafts, as OpenAI reports predicted outputs
        "completion_tokens_details": {
            "accepted_prediction_tokens": u.accepted_tokens,
            "rejected_prediction_tokens": u.drafted_tokens - u.accepted_tokens,
        },
    }
