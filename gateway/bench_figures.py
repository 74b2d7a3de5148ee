"""The throughput figures of `zinfer bench`, computed the same way for zinfer and llama.cpp.

A group is a set of requests that arrive together at `start`; each stream of it is the
list of times its output tokens arrived (perf_counter seconds, in order). From a group:

- end to end: every output token of the group over the time from the arrival to the
  last completion. It exists at any concurrency and counts prefill, queueing and decode,
  as a user who sent the whole group at once sees it.
- decode window: each stream's tokens after its first, summed over the group, over the
  union of the streams' decode spans (from the earliest first token of any stream to the
  latest last token). A stream's first token closes its prefill, so this is the rate of
  decoded tokens while any stream was decoding; it is never empty when some stream
  decoded two tokens at different times, even when the first streams finish before the
  last one's first token. Prefill rounds of later streams that fall inside the window
  count against it, on both engines alike.

Groups add up: tokens over the sum of the groups' seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Stream = list[float]  # token arrival times of one request


@dataclass(frozen=True)
class GroupFigures:
    """One group's counts and seconds (see the module docstring)."""

    tokens: int  # every output token of the group
    e2e_s: float  # arrival -> last completion
    decode_tokens: int  # tokens after each stream's first
    decode_s: float  # earliest first token -> latest last token
    first_completion_s: float  # arrival -> the first stream's last token
    last_first_token_s: float  # arrival -> the last stream's first token


def group_figures(start: float, streams: list[Stream]) -> GroupFigures:
    """The figures of one group that arrived at `start`; every stream has at least one token."""
    if not streams or any(not s for s in streams):
        raise ValueError("every stream of a bench group needs at least one token")
    firsts, lasts = [s[0] for s in streams], [s[-1] for s in streams]
    return GroupFigures(
        tokens=sum(len(s) for s in streams),
        e2e_s=max(lasts) - start,
        decode_tokens=sum(len(s) - 1 for s in streams),
        decode_s=max(lasts) - min(firsts),
        first_completion_s=min(lasts) - start,
        last_first_token_s=max(firsts) - start,
    )


def summarize(start_and_streams: list[tuple[float, list[Stream]]]) -> dict[str, Any]:
    """Figures over several groups: e2e_tok_s and decode_tok_s (None where no time passed
    or nothing decoded), their counts and seconds, the slowest group's first completion
    and last first token (seconds after arrival), and TTFT/ITL percentiles."""
    groups = [group_figures(start, streams) for start, streams in start_and_streams]
    tokens, e2e_s = sum(g.tokens for g in groups), sum(g.e2e_s for g in groups)
    decode_tokens, decode_s = sum(g.decode_tokens for g in groups), sum(g.decode_s for g in groups)
    ttfts = [s[0] - start for start, streams in start_and_streams for s in streams]
    itls = [d for _, streams in start_and_streams for s in streams for d in np.diff(s).tolist()]
    return {
        "e2e_tok_s": tokens / e2e_s if e2e_s > 0 else None,
        "decode_tok_s": decode_tokens / decode_s if decode_tokens and decode_s > 0 else None,
        "tokens": tokens,
        "e2e_s": e2e_s,
        "decode_tokens": decode_tokens,
        "decode_s": decode_s,
        "first_completion_s": max(g.first_completion_s for g in groups),
        "last_first_token_s": max(g.last_first_token_s for g in groups),
        "ttft": percentiles(ttfts),
        "itl": percentiles(itls),
    }


def percentiles(xs: list[float]) -> dict[str, float]:
    """p50/p90/p99 of seconds, in milliseconds ({} for no values)."""
    if not xs:
        return {}
    a = np.asarray(xs) * 1000
    return {f"p{q}_ms": float(np.percentile(a, q)) for q in (50, 90, 99)}
