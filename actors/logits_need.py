"""How much of a logits row the sampler needs for one sequence: the rule the scheduler
states per RoundSeq (`logits_need`) and the executor reduces to on the device.

    0      the full row [vocab]
    1      only the argmax (id and value)
    k > 1  the top-k candidates (ids and values), best first, ties to the lower id

Why each reduced case is exact (the token equals the one the full row gives, for the
same seed and step; see actors/sampling.py for the processing order):

- Every reduced case has no logit_bias and no penalties, so the processed logits the
  sampler would build are the raw logits themselves: nothing outside the candidates
  could move into them.
- No logprobs: reported logprobs are a log-softmax over the whole row, so a request that
  asks for them needs it whole.
- No grammar constraint: a mask can ban any token, the best ones included.
- Greedy (temperature 0) picks the argmax, ties to the lowest id: candidate 0.
- top_k sampling: temperature keeps the order of the logits, and top_k comes first, so
  top_p and min_p only ever read the top_k candidates (probabilities renormalised over
  them, the nucleus and the min_p floor taken among them). Both paths order the
  candidates the same canonical way, (-value, id), so the cdf walk with the request's one
  uniform draw lands on the same token. top_k = 1 is one candidate: the argmax.
- Error cases stay exact too: the reduced row carries its full-row max, so NaN, +inf and
  all -inf rows fail the request just as the full row would.

Rows whose k reaches the vocabulary go whole (the executor checks); k is capped at
TOPK_CAP so a reduced row stays small.
"""

from __future__ import annotations

from typing import Any

from zinfer.messages.params import SamplingParams

FULL_ROW = 0
ARGMAX = 1
TOPK_CAP = 256
"""The largest top_k served from candidates; a larger top_k ships the full row."""


def logits_needed(params: SamplingParams) -> int:
    """0 (the full row), 1 (the argmax) or k (the top-k candidates) for a sequence with params."""
    constraint: Any = getattr(params, "constraint", None)
    if constraint is not None or params.logprobs is not None or params.logit_bias:
        return FULL_ROW
    if params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        return FULL_ROW
    if params.temperature == 0.0:
        return ARGMAX
    if 1 <= params.top_k <= TOPK_CAP:
        return params.top_k
    return FULL_ROW
