"""What the front door (actors/front_door_actor.py) keeps per open request, and the line it logs
when one ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from zinfer.messages.client import Usage
from zinfer.messages.params import SamplingParams
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher


@dataclass
class Choice:
    seq_id: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    tokens: int = 0
    finish_reason: str | None = None


@dataclass
class Request:
    request_id: str
    peer: bytes
    prompt_ids: list[int]
    choices: list[Choice]
    cached_tokens: int = 0
    logprobs: bool = False
    top_n: int = 0
    params: SamplingParams = field(default_factory=SamplingParams)  # for the request's log line
    started: float = 0.0  # perf_counter at arrival
    first_token: float = 0.0  # perf_counter at the first delta
    span: Span | None = None  # its "request" span while tracing

    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), sum(c.tokens for c in self.choices), self.cached_tokens)



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
