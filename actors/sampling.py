"""Turning one row of logits into one token, per request parameters (pure numpy, no I/O).

Processing order, as in vLLM and llama.cpp:
  logit_bias -> repetition penalty (prompt + generated: positive logits divided, negative
  multiplied) -> presence / frequency penalties (generated only) -> greedy argmax if
  temperature == 0 (ties to the lowest id) -> else temperature -> top_k -> top_p -> min_p
  -> one draw from the request's own generator. A request with a constraint has the
  tokens its grammar bans set to -inf after the penalties (`grammar`, a GrammarMask of
  actors/constraints.py that the sampler actor attaches).

Reproducibility: each request owns a np.random.Generator seeded by params.seed and every
sample() call consumes exactly one uniform from it, so a seeded request gets the same
tokens whatever else shares its batch, and in whatever order.

top_k candidates are taken in one canonical order, value descending with ties to the lower
id, so sampling from the candidates the device kept (sample_candidates) walks the same cdf
as sampling from the full row.

Reported logprobs are OpenAI-style: log-softmax of the raw logits, before any of the
processing above. They are computed only for requests that ask for them
(params.logprobs set): the log-sum-exp over the vocabulary costs more than a greedy pick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import msgspec
import numpy as np

from zinfer.actors.logits_need import logits_needed
from zinfer.kernels.oracle.topk import numpy_topk
from zinfer.messages.params import SamplingParams

if TYPE_CHECKING:
    from zinfer.actors.constraints import GrammarMask

# top_p first looks for the nucleus among this many most likely tokens (then 8x more at a
# time), and sorts the whole vocabulary only when none of those sets holds top_p of the mass.
_NUCLEUS_PROBE = 512


class SampledToken(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One sampled token, and its raw logprob and top alternatives when asked for."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class RequestSampler:
    """The sampling state of one request: its generator and the token counts penalties use.

    sample() reads logits and advances the generator by one draw; accept() records a
    generated token. Neither touches another request's state.
    """

    def __init__(
        self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int, seq_id: int | None = None
    ) -> None:
        params.validate()
        self.params = params
        self.seq_id = seq_id  # names the sequence in error messages
        self.prompt_ids = prompt_ids
        self.vocab_size = vocab_size
        # seed None: fresh OS entropy; negative seeds map onto the unsigned range
        self.rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)
        self.generated: list[int] = []
        prompt = np.asarray(prompt_ids, dtype=np.int64)  # [prompt_len]
        self._check_ids(prompt, "prompt token id")
        self._rep_ids = np.unique(prompt)  # [n_seen] prompt + generated ids, for repetition
        self._counts: dict[int, int] = {}  # generated id -> times generated
        bias = params.logit_bias
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))  # [n_bias]
        self._bias_vals = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))  # [n_bias]
        self._check_ids(self._bias_ids, "logit_bias token id")
        # for params.constraint (actors/constraints.py): masked(z), accept(token)
        self.grammar: GrammarMask | None = None

    def _check_ids(self, ids: np.ndarray, what: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"{what} {int(bad)} outside vocabulary of {self.vocab_size}")

    def accept(self, token_id: int) -> None:
        """Record token_id as generated: it now counts for all three penalties."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} outside vocabulary of {self.vocab_size}")
        if self.grammar is not None:
            self.grammar.accept(token_id)  # raises, recording nothing, if the grammar bans it
        self.generated.append(token_id)
        self._counts[token_id] = self._counts.get(token_id, 0) + 1
        if self._counts[token_id] == 1:
            i = np.searchsorted(self._rep_ids, token_id)
            if i == self._rep_ids.size or self._rep_ids[i] != token_id:
                self._rep_ids = np.insert(self._rep_ids, i, token_id)

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Choose the next token from logits [vocab] (not modified); does not record it (see accept).

        Raises ValueError on a wrong shape, NaN or +inf, or when every token is -inf.
        """
        if logits.shape != (self.vocab_size,):
            raise ValueError(f"logits shape {logits.shape} != ({self.vocab_size},)")
        p = self.params
        z = self._processed(logits)  # [vocab]
        token = None
        if p.temperature == 0.0 and z is logits:  # greedy on raw logits: one pass finds the max
            token = int(np.argmax(logits))  # NaN and +inf win argmax, so the checks below see them
            raw_max = logits[token]
        else:
            raw_max = logits.max()
        self._check_finite(raw_max)
        u = self.rng.random()  # exactly one draw per call
        if token is None and p.temperature == 0.0:
            token = int(np.argmax(z))
            if z[token] == -np.inf:
                raise ValueError("every token is banned (all processed logits are -inf)")
        elif token is None and self.grammar is not None:
            # draw among the allowed only: a mostly -inf row slows top_p's probe
            allowed = np.flatnonzero(z != -np.inf)  # [n_allowed] ids, ascending
            if not allowed.size:
                raise ValueError("every token is banned (all processed logits are -inf)")
            token = int(allowed[_draw(z[allowed], p.temperature, p.top_k, p.top_p, p.min_p, u)])
        elif token is None:
            token = _draw(z, p.temperature, p.top_k, p.top_p, p.min_p, u)
        return self.report(logits, raw_max, token)

    def sample_candidates(self, ids: np.ndarray, values: np.ndarray, row_max: float) -> SampledToken:
        """Choose the next token from the best candidates of its raw logits row: ids [K] and
        values [K] in (-value, id) order (kernels/oracle/topk.py), row_max the row's max over
        the whole vocabulary. Gives the token sample() gives on the full row, with the same
        checks and the one draw, for params whose logits_needed(params) is k with 1 <= k <= K
        (actors/logits_need.py says why that is exact). Does not record it (see accept)."""
        k = logits_needed(self.params)
        if not 1 <= k <= ids.shape[0]:
            raise ValueError(
                f"seq {self.seq_id} needs {k or 'all'} logits, the round carried {ids.shape[0]} candidates")
        self._check_finite(row_max)
        u = self.rng.random()  # exactly one draw per call
        p = self.params
        if p.temperature == 0.0:
            return SampledToken(token_id=int(ids[0]))
        kept_ids, probs = candidate_distribution(ids[:k], values[:k], p.temperature, p.top_p, p.min_p)
        return SampledToken(token_id=walk(kept_ids, probs, u))

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """The distribution sample(logits) draws from when temperature > 0: (ids [n], probs [n],
        the raw row's max), with sample()'s checks; draws nothing, records nothing."""
        if logits.shape != (self.vocab_size,):
            raise ValueError(f"logits shape {logits.shape} != ({self.vocab_size},)")
        p = self.params
        z = self._processed(logits)  # [vocab]
        raw_max = float(logits.max())
        self._check_finite(raw_max)
        if self.grammar is None:
            ids, probs = filtered_distribution(z, p.temperature, p.top_k, p.top_p, p.min_p)
            return ids, probs, raw_max
        allowed = np.flatnonzero(z != -np.inf)  # [n_allowed] ids, ascending
        if not allowed.size:
            raise ValueError("every token is banned (all processed logits are -inf)")
        ids, probs = filtered_distribution(z[allowed], p.temperature, p.top_k, p.top_p, p.min_p)
        return allowed[ids], probs, raw_max

    def candidates_distribution(self, ids: np.ndarray, values: np.ndarray, row_max: float
                                ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution sample_candidates draws from when temperature > 0: (ids [n], probs [n]),
        with its checks; draws nothing, records nothing."""
        k = logits_needed(self.params)
        if not 1 <= k <= ids.shape[0]:
            raise ValueError(
                f"seq {self.seq_id} needs {k or 'all'} logits, the round carried {ids.shape[0]} candidates")
        self._check_finite(row_max)
        p = self.params
        return candidate_distribution(ids[:k], values[:k], p.temperature, p.top_p, p.min_p)

    def _check_finite(self, raw_max: float) -> None:
        """Raise ValueError when a row's max over the vocabulary is NaN, +inf or -inf."""
        if np.isnan(raw_max) or raw_max == np.inf:
            raise ValueError(f"logits of seq {self.seq_id} are not finite (NaN or +inf)")
        if raw_max == -np.inf:
            raise ValueError(f"logits of seq {self.seq_id} are not finite (all -inf)")

    def _processed(self, logits: np.ndarray) -> np.ndarray:
        """Logits after bias, penalties and the grammar mask: a copy when any applies, else the input itself."""
        p = self.params
        z = logits
        if self._bias_ids.size:
            z = z.astype(np.float32, copy=True)
            np.add.at(z, self._bias_ids, self._bias_vals)
        if p.repetition_penalty != 1.0 and self._rep_ids.size:
            z = z.astype(np.float32, copy=z is logits)
            v = z[self._rep_ids]  # [n_seen]
            z[self._rep_ids] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            z = z.astype(np.float32, copy=z is logits)
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            z[ids] -= p.frequency_penalty * counts + p.presence_penalty
        if self.grammar is not None:
            z = self.grammar.masked(z)  # a copy, banned tokens at -inf
        return z

    def report(self, logits: np.ndarray, raw_max: float, token: int) -> SampledToken:
        """token, with its raw log-softmax logprob and the top-N alternatives if asked for."""
        n = self.params.logprobs
        if n is None:
            return SampledToken(token_id=token)
        e = logits.astype(np.float64)  # [vocab]; exp(logits - max) in place: one temporary
        e -= float(raw_max)
        np.exp(e, out=e)
        lse = float(raw_max) + float(np.log(e.sum()))
        n = min(n, self.vocab_size)
        ids = np.argpartition(logits, self.vocab_size - n)[self.vocab_size - n :] if n else np.empty(0, np.int64)
        vals = logits[ids].astype(np.float64) - lse  # [n]
        order = np.lexsort((ids, -vals))
        top = [(int(ids[i]), float(vals[i])) for i in order]
        return SampledToken(token_id=token, logprob=float(logits[token]) - lse, top_logprobs=top)


def filtered_distribution(
    z: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """The distribution sample() draws from, given processed logits z [vocab] and T > 0.

    Returns (ids [n], probs [n]): the tokens that survive top_k, top_p and min_p with
    their renormalised probabilities, all > 0 and summing to 1, in an order that is the
    same for equal inputs. Raises ValueError if every token is banned (-inf).
    """
    if 0 < top_k < z.shape[0]:
        ids, values = numpy_topk(z, top_k)  # [1, k] each, in the canonical (-value, id) order
        return candidate_distribution(ids[0], values[0], temperature, top_p, min_p)
    return candidate_distribution(None, z, temperature, top_p, min_p)


def candidate_distribution(
    ids: np.ndarray | None, values: np.ndarray, temperature: float, top_p: float, min_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """filtered_distribution's top_p, min_p and temperature over candidates: ids [n] with
    values [n] (processed logits, in (-value, id) order), or ids None for the whole row
    values [vocab]. The same (ids, probs) whether the candidates came from the full row or
    from the device (devices/reductions.py): the arithmetic and its order are the same."""
    cand = values.astype(np.float64)  # [n_cand]
    m = cand.max()
    if m == -np.inf:
        raise ValueError("every token is banned (all processed logits are -inf)")
    probs = np.exp((cand - m) / temperature)  # [n_cand]
    probs /= probs.sum()
    keep = _nucleus(probs, top_p) if top_p < 1.0 else None  # [n_keep] indices into cand
    if min_p > 0.0:
        floor = min_p * probs.max()
        keep = np.flatnonzero(probs >= floor) if keep is None else keep[probs[keep] >= floor]
    if keep is not None:
        probs = probs[keep]
        ids = keep if ids is None else ids[keep]
    live = probs > 0.0  # drop underflowed tokens so a draw can never pick one
    ids = np.flatnonzero(live) if ids is None else ids[live]
    probs = probs[live]
    return ids, probs / probs.sum()


def _draw(z: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """The token of filtered_distribution(z, ...) that the uniform u in [0, 1) picks."""
    return walk(*filtered_distribution(z, temperature, top_k, top_p, min_p), u)


def walk(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The id of ids [n] whose cdf step over probs [n] holds the uniform u in [0, 1)."""
    cdf = np.cumsum(probs)  # [n]
    i = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), cdf.size - 1)
    return int(ids[i])


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest most-likely set with mass >= top_p (at least one), likeliest first.

    Looks among the _NUCLEUS_PROBE most likely first, then 8x more at a time, so a peaked
    distribution over a large vocabulary never sorts it whole. Ties are broken by a
    deterministic sort, the same for equal inputs.
    """
    n = probs.size
    head = np.arange(n)
    size = _NUCLEUS_PROBE
    while size < n:
        cand = np.argpartition(probs, n - size)[n - size :]  # [size]
        if probs[cand].sum() >= top_p:
            head = cand
            break
        size *= 8
    order = head[np.argsort(-probs[head], kind="stable")]  # [len(head)] likeliest first, ties in candidate order
    cum = np.cumsum(probs[order])
    count = int(np.searchsorted(cum, top_p, side="left")) + 1  # first prefix with mass >= top_p
    return order[:count]


def sample_batch(samplers: Sequence[RequestSampler], logits: np.ndarray) -> list[SampledToken]:
    """Sample one token per row of logits [n, vocab] with the matching request's sampler.

    Rows are independent: each uses only its own sampler's state. Mutates only the
    samplers' generators (one draw each); tokens are recorded by calling accept().
    """
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits shape {logits.shape} does not match {len(samplers)} samplers")
    return [s.sample(row) for s, row in zip(samplers, logits)]
