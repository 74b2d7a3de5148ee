"""Speculative decoding's verifying side: a draft checked row by row against the target's logits.

A sequence that drafted k tokens d_0..d_{k-1} gets k + 1 logits rows from one round: row i
is the model's next-token logits after the sequence and d_0..d_{i-1}. The sampler walks the
rows in order with the sequence's own RequestSampler (penalties, grammar mask, seed), so each
row is processed exactly as plain decoding would process it once the tokens before it are
the same:

- greedy: row i's token is its argmax (as plain decoding picks it); the walk stops after the
  first token that differs from the draft, so every token is the one plain decoding gives;
- sampling (Leviathan et al. 2023, Chen et al. 2023), p row i's distribution after every filter:
  - a draft that puts all its mass on d_i (prompt lookup): d_i is kept with probability p(d_i);
    when it is refused the token is drawn from p without d_i, renormalised;
  - a draft model's d_i drawn from its distribution q_i (actors/draft_model.py): d_i is kept
    with probability min(1, p(d_i) / q_i(d_i)); when it is refused the token is drawn from
    max(0, p - q_i), renormalised.
  Each token so follows p exactly; after k kept drafts row k gives one more token as plain
  sampling would.

A drafted token the grammar bans has p = 0 there and is refused, so constrained requests stay
exact with no separate check. Every token kept is recorded (RequestSampler.accept) before the
next row is read; a row that fails ends the sequence as a plain row would.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from zinfer.actors.sampling import RequestSampler, SampledToken, walk


def verify_rows(sampler: RequestSampler, draft: list[int], sample_row: Callable[[int, int | None], SampledToken]
                ) -> list[SampledToken]:
    """The tokens draft's len(draft) + 1 rows give: the kept prefix of draft and the token after
    it. sample_row(i, d) samples row i for draft token d (None past the draft) without
    recording it; each returned token is recorded in sampler in order. Raises what a row raises."""
    out = []
    for i in range(len(draft) + 1):
        d = draft[i] if i < len(draft) else None
        s = sample_row(i, d)
        sampler.accept(s.token_id)
        out.append(s)
        if d is None or s.token_id != d:
            break
    return out


def full_row_sampler(sampler: RequestSampler, rows: np.ndarray, q: np.ndarray | None = None
                     ) -> Callable[[int, int | None], SampledToken]:
    """sample_row for verify_rows over full logits rows [k + 1, vocab]; q: the drafts' proposal
    distributions [k, draft vocab] (None: point masses)."""

    def sample_row(i: int, d: int | None) -> SampledToken:
        logits = rows[i]  # [vocab]
        if d is None or sampler.params.temperature == 0.0:
            return sampler.sample(logits)
        ids, probs, raw_max = sampler.distribution(logits)
        return sampler.report(logits, raw_max, pick(ids, probs, d, sampler.rng, None if q is None else q[i]))

    return sample_row


def candidates_sampler(sampler: RequestSampler, ids: np.ndarray, values: np.ndarray, row_max: np.ndarray,
                       q: np.ndarray | None = None) -> Callable[[int, int | None], SampledToken]:
    """sample_row for verify_rows over candidate rows: ids, values [k + 1, K], row_max [k + 1];
    q as full_row_sampler's."""

    def sample_row(i: int, d: int | None) -> SampledToken:
        if d is None or sampler.params.temperature == 0.0:
            return sampler.sample_candidates(ids[i], values[i], float(row_max[i]))
        kept_ids, probs = sampler.candidates_distribution(ids[i], values[i], float(row_max[i]))
        return SampledToken(token_id=pick(kept_ids, probs, d, sampler.rng, None if q is None else q[i]))

    return sample_row


def pick(ids: np.ndarray, probs: np.ndarray, d: int, rng: np.random.Generator, q: np.ndarray | None = None) -> int:
    """The token for drafted token d from the distribution p (ids [n], probs [n]), one or two
    uniforms of rng. q None (d proposed as a point mass): d with probability p(d), else a draw
    from p without d renormalised. q [draft vocab] (d drawn from q; ids past its end have
    q = 0): d with probability min(1, p(d) / q(d)), else a draw from max(0, p - q) renormalised."""
    hit = np.flatnonzero(ids == d)  # [0 or 1]
    p_d = float(probs[hit[0]]) if hit.size else 0.0
    rest = probs.astype(np.float64, copy=True)  # [n]
    if q is None:
        if rng.random() < p_d:
            return d
        if hit.size:
            rest[hit[0]] = 0.0
    else:
        q_d = float(q[d]) if 0 <= d < q.shape[0] else 0.0
        if rng.random() * q_d < p_d:  # u < p(d) / q(d); q(d) > 0 for a d drawn from q
            return d
        inside = ids < q.shape[0]  # [n]
        rest[inside] -= q[ids[inside]]
        np.maximum(rest, 0.0, out=rest)
    total = rest.sum()
    if total <= 0.0:  # p(d) == 1 (or p <= q everywhere) up to rounding: nothing else to draw
        return d
    return walk(ids, rest / total, rng.random())
