"""What the front door (actors/front_door_actor.py) keeps per open request, the checks a request
passes before its prompt is encoded, and the line it logs when one ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from zinfer.actors.prompt_encoding import PromptLimits
from zinfer.messages.client import Delta, Generate, TopLogprob, Usage
from zinfer.messages.engine import SeqOutput
from zinfer.models.prompt import PromptBuilder
from zinfer.messages.params import SamplingParams
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher


@dataclass
class Choice:
    seq_id: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    tokens: int = 0
    finish_reason: str | None = None

    def feed(self, token_ids: list[int], finish_reason: str | None) -> tuple[str, str | None, int]:
        """The text these tokens add to the choice's stream, why the choice ends here (None: it
        goes on), and how many of the tokens it keeps. The text is detokenized incrementally
        (never half a UTF-8 character) and held back while it may begin a stop string; a stop
        string that matches ends the choice with reason "stop", its text cut before the string
        and its tokens after the one that completed it (several tokens come at once from
        speculative decoding) dropped, as one token at a time would have ended it."""
        pieces = [self.detok.push(t) for t in token_ids]  # the text each token completes
        if finish_reason:
            tail = self.detok.flush()
            pieces = pieces[:-1] + [pieces[-1] + tail] if pieces else [tail]
        emit = ""
        for i, text in enumerate(pieces):
            out, hit = self.stops.feed(text)
            emit += out
            if hit:
                kept = min(i + 1, len(token_ids))
                self.tokens += kept
                return emit, "stop", kept
        self.tokens += len(token_ids)
        if finish_reason:
            emit += self.stops.flush()
        return emit, finish_reason, len(token_ids)


@dataclass
class Request:
    request_id: str
    peer: bytes
    prompt_ids: list[int]
    choices: list[Choice]
    cached_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding, over its choices
    accepted_tokens: int = 0
    logprobs: bool = False
    top_n: int = 0
    params: SamplingParams = field(default_factory=SamplingParams)  # for the request's log line
    started: float = 0.0  # perf_counter at arrival
    first_token: float = 0.0  # perf_counter at the first delta
    span: Span | None = None  # its "request" span while tracing

    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), sum(c.tokens for c in self.choices), self.cached_tokens,
                     self.drafted_tokens, self.accepted_tokens)

    def delta(self, index: int, out: SeqOutput, text: str, reason: str | None) -> Delta:
        """The client event for choice `index`: its text, its tokens, and their logprobs if asked."""
        delta = Delta(self.request_id, index, text, list(out.token_ids), finish_reason=reason)
        if self.logprobs and out.logprobs is not None:
            delta.logprobs = list(out.logprobs)
            if self.top_n and out.top:
                delta.top_logprobs = [[TopLogprob(t, lp) for t, lp in top] for top in out.top]
        return delta


def request_fields(r: Request, outcome: str, reasons: list[str], now: float) -> dict[str, Any]:
    """The request's log line (and its span's attributes): tokens, timing, sampling."""
    completion = sum(c.tokens for c in r.choices)
    decode_s = now - r.first_token if r.first_token else 0.0
    decoded = completion - len(r.choices)  # tokens after each choice's first
    p = r.params
    return {
        "request_id": r.request_id,
        "outcome": outcome,
        "finish_reason": ",".join(reasons) or None,
        "prompt_tokens": len(r.prompt_ids),
        "completion_tokens": completion,
        "cached_tokens": r.cached_tokens,
        "ttft_ms": round((r.first_token - r.started) * 1000, 2) if r.first_token else None,
        "tokens_per_s": round(decoded / decode_s, 1) if decode_s > 0 and decoded > 0 else None,
        "seconds": round(now - r.started, 3),
        "n": p.n,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "seed": p.seed,
        "max_tokens": p.max_tokens,
    }


def check_before_encoding(
    req: Generate, prompts: PromptBuilder, limits: PromptLimits, max_model_len: int, max_waiting: int
) -> None:
    """ValueError (PromptTooLong for a prompt over the limits) for what is refused before any
    encoding: bad sampling parameters, max_tokens or a constraint's prefix_ids past the
    context, more choices than the engine queues at once (max_waiting; 0: unchecked), a
    prompt too long for any encoding."""
    req.params.validate()
    max_tokens, n = req.params.max_tokens, req.params.n
    if max_tokens > max_model_len:  # OpenAI and vLLM refuse it too: never silently clamped
        raise ValueError(f"max_tokens {max_tokens} exceeds the context of {max_model_len} tokens")
    c = req.params.constraint
    if c is not None and len(c.prefix_ids) > max_model_len:  # bounded before the grammar worker walks them
        raise ValueError(f"constraint prefix_ids: {len(c.prefix_ids)} ids exceed the context of {max_model_len} tokens")
    if max_waiting and n > max_waiting:  # queue_full would come every time: no retry helps
        raise ValueError(f"n {n} exceeds the {max_waiting} sequences the engine queues at once (--max-waiting)")
    prompts.check_params(req.params.logit_bias, req.params.stop_token_ids)
    if req.prompt is not None:
        limits.check_text(len(req.prompt))
    if req.prompt_ids is not None:
        limits.check_ids(len(req.prompt_ids))
