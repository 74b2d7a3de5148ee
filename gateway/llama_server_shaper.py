"""llama-server's native response shapes for /completion and /infill: engine events in, one
result object or its SSE chunks out.

A result has content, tokens (the ids generated, with return_tokens), stop, stop_type
("eos", "limit" or "word", with stopping_word; a gateway stop rule: "word" with the suffix
text where the middle reached the hole's end, "limit" for n_indent and t_max_predict_ms),
truncated (never: a prompt longer than the context is refused, not cut), tokens_predicted /
tokens_evaluated / tokens_cached, the generation_settings the request ran with, timings
(prompt_n counts the tokens evaluated, cache_n those read from the prefix cache) and, with
n_probs, completion_probabilities.
With response_fields, a whole answer holds only those fields (a stream is not picked from).
A stream sends `data: {...}` chunks with the text pieces (stop false) and a last chunk with
stop true and every field above; there is no [DONE], as llama-server sends none.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, AsyncIterator

from zinfer.gateway.error_shapes import LlamaServerError, reshaped
from zinfer.gateway.llama_server_stops import StreamCut
from zinfer.gateway.model_facts import ModelFacts
from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.openai_shaper import engine_error
from zinfer.gateway.progress import Progress, timings
from zinfer.gateway.protocol_events import matched_stop
from zinfer.gateway.sse import frame
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams

Body = dict[str, Any]
RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: a seed drawn per request


def settings(params: SamplingParams, n_predict: int, samplers: list[str]) -> Body:
    """generation_settings: what the request ran with."""
    return {
        "n_predict": n_predict, "seed": RANDOM_SEED if params.seed is None else params.seed,
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
        "repeat_penalty": params.repetition_penalty, "repeat_last_n": -1, "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty, "stop": params.stop, "n_probs": params.logprobs or 0,
        "ignore_eos": params.ignore_eos, "logit_bias": [[t, b] for t, b in params.logit_bias.items()],
        "samplers": samplers, "max_tokens": params.max_tokens,
        "grammar": params.constraint.spec if params.constraint is not None else "",
    }


class LlamaServerShaper:
    """Turns one request's engine events into a /completion result or its chunks."""

    def __init__(
        self,
        state: GatewayState,
        facts: ModelFacts,
        params: SamplingParams,
        progress: Progress,
        prompt: str,
        generation_settings: Body,
        return_tokens: bool,
        timings_per_token: bool,
        constraint_param: str | None,
        cut: StreamCut | None = None,
        fields: list[str] | None = None,
    ):
        self.state, self.facts, self.params, self.progress = state, facts, params, progress
        self.prompt, self.generation_settings = prompt, generation_settings
        self.return_tokens, self.timings_per_token = return_tokens, timings_per_token
        self.constraint_param, self.cut, self.fields = constraint_param, cut, fields
        self.predicted = 0

    def error(self, event: Rejected | Failed | Cancelled) -> ApiError:
        return reshaped(engine_error(event, chat=False, constraint_param=self.constraint_param), LlamaServerError)

    def probs(self, d: Delta) -> list[Body]:
        """completion_probabilities entries of a delta's tokens."""

        def entry(tid: int, logprob: float) -> Body:
            raw = self.facts.prompts.tokenizer.token_bytes(tid)
            return {"id": tid, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": logprob}

        tops = d.top_logprobs or [[] for _ in d.token_ids]
        return [{**entry(t, lp), "top_logprobs": [entry(x.token_id, x.logprob) for x in top]}
                for t, lp, top in zip(d.token_ids, d.logprobs or [], tops)]

    def chunk(self, d: Delta) -> Body:
        self.predicted += len(d.token_ids)
        out: Body = {"index": 0, "content": d.text, "tokens": d.token_ids if self.return_tokens else [],
                     "stop": False, "id_slot": -1, "tokens_predicted": self.predicted,
                     "tokens_evaluated": self.progress.prompt_tokens}
        if self.params.logprobs:
            out["completion_probabilities"] = self.probs(d)
        if self.timings_per_token:
            out["timings"] = timings(self.progress, self.predicted, self.progress.prompt_tokens, 0)
        return out

    async def result(self, event: Finished, content: str, probs: list[Body] | None) -> Body:
        reason = event.finish_reasons[0] if event.finish_reasons else "stop"
        cut = self.cut.reason if self.cut is not None else None
        if cut is not None:  # a gateway stop rule: the suffix reached is a stop word, the others limits
            word, stop_type = (self.cut.word, "word") if cut == "suffix" and self.cut is not None else (None, "limit")
        else:
            word = None if reason == "length" else await matched_stop(self.state.engine(), self.progress,
                                                                      self.params.stop)
            stop_type = "limit" if reason == "length" else "word" if word is not None else "eos"
        u = event.usage
        out: Body = {
            "index": 0, "content": content, "tokens": self.progress.token_ids if self.return_tokens else [],
            "id_slot": 0, "stop": True, "model": self.state.model_name, "tokens_predicted": u.completion_tokens,
            "tokens_evaluated": u.prompt_tokens, "generation_settings": self.generation_settings,
            "prompt": self.prompt, "has_new_line": "\n" in "".join(self.progress.text), "truncated": False,
            "stop_type": stop_type, "stopping_word": word or "", "tokens_cached": u.cached_tokens,
            "timings": timings(self.progress, u.completion_tokens, u.prompt_tokens, u.cached_tokens),
        }
        if probs is not None:
            out["completion_probabilities"] = probs
        return out

    async def collect(self, events: AsyncIterator[ClientEvent]) -> Body | ApiError:
        text: list[str] = []
        probs: list[Body] | None = [] if self.params.logprobs else None
        async for event in events:
            if isinstance(event, Delta) and event.index == 0:
                text.append(event.text)
                if probs is not None:
                    probs += self.probs(event)
            elif isinstance(event, Finished):
                whole = await self.result(event, "".join(text), probs)
                return picked(whole, self.fields) if self.fields else whole
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                return self.error(event)
        return self.error(Failed("", "the engine stream ended early"))

    async def stream(
        self, first: ClientEvent, events: AsyncIterator[ClientEvent], usage: bool
    ) -> AsyncGenerator[bytes, None]:
        """`data:` chunks from the first output on; the last one has stop true and the totals."""
        event = first
        while True:
            if isinstance(event, Delta) and event.index == 0 and (event.text or event.token_ids):
                yield frame(self.chunk(event))
            elif isinstance(event, Finished):
                yield frame(await self.result(event, "", None))
                return
            elif isinstance(event, (Rejected, Failed, Cancelled)):
                yield frame(self.error(event).body())
                return
            event = await events.__anext__()


def picked(body: Body, fields: list[str]) -> Body:
    """llama-server's response_fields: each field the answer has, found by its path ("a/b": b
    inside a) and keyed by it; a field it lacks is left out."""
    out: Body = {}
    for name in fields:
        value: Any = body
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out
