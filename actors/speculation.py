"""Speculative decoding's drafting side: prompt lookup (n-gram) drafts and their adaptive length.

Pure state per sequence, no I/O; the scheduler policy (actors/scheduler_policy.py) asks each
decoding sequence for a draft while planning a round, and tells it how many drafted tokens
verification kept. The round then computes the sequence's last token and its draft as one
multi-row chunk; the sampler verifies the draft row by row (actors/speculation_verify.py), so
the tokens a sequence gets are exactly those decoding without a draft would give (greedy), or
follow the same distribution (sampling).

Prompt lookup (as llama.cpp's `--lookup` and vLLM's n-gram proposer): find the most recent
earlier place where the sequence's last n tokens (n from max_n down to min_n) already occur,
in the prompt or the output, and propose the tokens that followed there. Edited code, summaries
and retrieval answers repeat their input, so such drafts are often right; where nothing repeats
no draft is made and the round is a plain decode step.

A draft model (mode "draft", actors/draft_model.py): a smaller model with the same vocabulary
proposes the tokens. The scheduler asks the drafter actor before planning a round
(actors/scheduler_core.py) and parks each proposal on the sequence's ModelDrafter, where the
plan picks it up as it picks up an n-gram draft.
"""

from __future__ import annotations

import msgspec
import numpy as np

SPECULATE_MODES = ("off", "ngram", "draft")
"""The speculation a server or request may ask for: "off" (plain decoding), "ngram" (prompt lookup)
or "draft" (a draft model's proposals; needs draft_model)."""


class SpeculationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the scheduler drafts. mode: the server's default, each request may override it
    (SamplingParams.speculative). max_draft: the most tokens prompt lookup drafts for a sequence per
    round; draft_max: the most a draft model drafts (each of its tokens costs a draft step, so fewer
    pay; llama-server's --draft-max).
    max_batch: drafts are made only while at most this many sequences run (past it a round is
    compute-bound and extra rows cost what they save). min_n, max_n: the n-gram lengths looked up.
    draft_model: the draft model (a name `zinfer pull` knows or a path; "" none), loaded at start
    so requests may ask for "draft" whatever the mode. draft_p_min: a draft model's proposal stops
    before the token that would bring the product of its tokens' probabilities (the draft's odds
    that the round keeps it whole) under this. draft_head: the draft model's LM head keeps
    the logits of the first this many token ids and the end-of-generation ids (actors/draft_head.py:
    a cheaper draft step); 0 keeps all."""

    mode: str = "off"
    max_draft: int = 4  # 4 verify rows cost ~1.5 rows on cpu-fast (BENCHMARKS.md): lookup's drafts are free to make
    draft_max: int = 2  # a draft model's third token cost more than it saved on 2 cores (BENCHMARKS.md)
    max_batch: int = 4
    min_n: int = 1
    max_n: int = 4
    draft_model: str = ""
    draft_p_min: float = 0.3  # swept on 2 cores: 0.2-0.45 within noise, 0.75 (llama.cpp's, per token) drafts too little
    draft_head: int = 32768

    def validate(self) -> None:
        if self.mode not in SPECULATE_MODES:
            raise ValueError(f"speculation mode {self.mode!r} is not one of {', '.join(SPECULATE_MODES)}")
        if not 1 <= self.max_draft <= 64 or not 1 <= self.draft_max <= 64:
            raise ValueError("speculation max_draft and draft_max must be 1 to 64")
        if self.max_batch < 0:
            raise ValueError("speculation max_batch must be >= 0")
        if not 1 <= self.min_n <= self.max_n <= 16:
            raise ValueError("speculation n-gram lengths must satisfy 1 <= min_n <= max_n <= 16")
        if self.mode == "draft" and not self.draft_model:
            raise ValueError('speculation mode "draft" needs a draft model (--draft-model NAME|PATH)')
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ValueError("speculation draft_p_min must be from 0 to 1")
        if self.draft_head < 0:
            raise ValueError("speculation draft_head must be >= 0 (0: the whole vocabulary)")


def adapted_length(length: int, drafted: int, accepted: int, max_draft: int) -> int:
    """The next draft's most tokens after a draft of `drafted` tokens kept `accepted`: double
    (up to max_draft) after a draft verified whole, one more than the tokens kept after a cut."""
    if drafted <= 0:
        return length
    if accepted >= drafted:
        return min(2 * length, max_draft)
    return max(1, min(accepted + 1, max_draft))


class NgramDrafter:
    """Prompt lookup over one growing sequence, indexed incrementally (O(max_n) per new token).

    For each n in min_n..max_n it maps an n-gram to the end (exclusive) of its most recent
    occurrence that is followed by a token, so a lookup never finds the sequence's own tail.
    The draft length adapts: it doubles (up to max_draft) after a draft verified whole, and
    drops to one more than the tokens kept after a draft that was cut.
    """

    def __init__(self, config: SpeculationConfig):
        self.config = config
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(config.max_n + 1)]  # [n] n-gram -> end
        self.indexed = 0  # tokens of the sequence whose following n-grams are indexed
        self.length = min(4, config.max_draft)  # the next draft's most tokens

    def _extend(self, ids: list[int]) -> None:
        """Index the n-grams ending before each token of ids not yet indexed (ids only grows)."""
        lo, hi = self.config.min_n, self.config.max_n
        for end in range(max(self.indexed, 1), len(ids)):  # ids[end] follows the n-grams ending at end
            for n in range(lo, min(hi, end) + 1):
                self.index[n][tuple(ids[end - n : end])] = end
        self.indexed = max(self.indexed, len(ids))

    def propose(self, ids: list[int], limit: int) -> list[int]:
        """Up to min(limit, the adaptive length) tokens that may follow ids (the sequence's
        prompt and output so far), or [] when its tail occurs nowhere earlier."""
        limit = min(limit, self.length)
        if limit <= 0:
            return []
        self._extend(ids)
        for n in range(min(self.config.max_n, len(ids) - 1), self.config.min_n - 1, -1):
            end = self.index[n].get(tuple(ids[len(ids) - n :]))
            if end is not None:
                return ids[end : end + limit]
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens kept `accepted` of them: adapt the next draft's length."""
        self.length = adapted_length(self.length, drafted, accepted, self.config.max_draft)


class ModelDrafter:
    """A sequence's proposals from the draft model, parked here between the drafter actor's reply
    and the round that verifies them, and their adaptive length (as NgramDrafter's).

    pending: the proposal for the sequence's next round, None until the drafter was asked since
    the last round ([] when it proposed nothing); probs: its q rows when sampled ([k, vocab]).
    known: leading tokens of the sequence the drafter actor holds (the next ask sends the rest).

    Asking costs a draft round even when nothing comes of it, so after asks in a row that kept no
    drafted token the sequence skips asking for a few rounds (1 after two misses, then up to
    MAX_SKIP); the drafter then catches up on those rounds' tokens in one chunk.
    """

    SKIP_AFTER = 2  # misses in a row before rounds are skipped
    MAX_SKIP = 3

    def __init__(self, config: SpeculationConfig):
        self.config = config
        self.length = config.draft_max
        self.pending: list[int] | None = None
        self.probs: np.ndarray | None = None  # [len(pending), draft vocab] float32, or None
        self.known = 0
        self.misses = 0  # asks in a row whose rounds kept no drafted token
        self.skip = 0  # rounds left to run without asking

    def wants(self) -> bool:
        """Whether the drafter should be asked before the sequence's next round."""
        return self.pending is None and self.skip == 0

    def take(self, tokens: list[int], probs: np.ndarray | None, known: int) -> None:
        """The drafter's proposal for the next round."""
        self.pending, self.probs, self.known = tokens, probs, known

    def propose(self, ids: list[int], limit: int) -> list[int]:
        """The parked proposal, cut to limit tokens ([] when none is parked)."""
        return (self.pending or [])[: max(limit, 0)]

    def q_rows(self, n: int) -> np.ndarray | None:
        """The q rows of the proposal's first n tokens ([n, vocab]), None for a greedy proposal."""
        return None if self.probs is None else self.probs[:n]

    def verified(self, drafted: int, accepted: int) -> None:
        """A round ran: adapt the length after a draft and the skipping after an ask; the next
        round asks again unless it skips."""
        self.length = adapted_length(self.length, drafted, accepted, self.config.draft_max)
        if self.pending is None:  # not asked for this round (a prefill chunk, or skipping)
            self.skip = max(self.skip - 1, 0)
        else:
            self.misses = 0 if accepted else self.misses + 1
            self.skip = min(self.misses - self.SKIP_AFTER + 1, self.MAX_SKIP) if self.misses >= self.SKIP_AFTER else 0
        self.pending, self.probs = None, None

    def reset(self) -> None:
        """The sequence was preempted: the drafter forgets it; it starts over when it runs again."""
        self.pending, self.probs, self.known, self.skip = None, None, 0, 0
