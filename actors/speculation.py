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
"""

from __future__ import annotations

import msgspec

SPECULATE_MODES = ("off", "ngram")
"""The speculation a server or request may ask for: "off" (plain decoding) or "ngram" (prompt lookup)."""


class SpeculationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the scheduler drafts. mode: the server's default, each request may override it
    (SamplingParams.speculative). max_draft: the most tokens drafted for a sequence per round.
    max_batch: drafts are made only while at most this many sequences run (past it a round is
    compute-bound and extra rows cost what they save). min_n, max_n: the n-gram lengths looked up."""

    mode: str = "off"
    max_draft: int = 2  # cpu-fast's int8 products cost ~40% of a decode step per row past 3 (BENCHMARKS.md)
    max_batch: int = 4
    min_n: int = 1
    max_n: int = 4

    def validate(self) -> None:
        if self.mode not in SPECULATE_MODES:
            raise ValueError(f"speculation mode {self.mode!r} is not one of {', '.join(SPECULATE_MODES)}")
        if not 1 <= self.max_draft <= 64:
            raise ValueError("speculation max_draft must be 1 to 64")
        if self.max_batch < 0:
            raise ValueError("speculation max_batch must be >= 0")
        if not 1 <= self.min_n <= self.max_n <= 16:
            raise ValueError("speculation n-gram lengths must satisfy 1 <= min_n <= max_n <= 16")


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
        if drafted <= 0:
            return
        if accepted >= drafted:
            self.length = min(2 * self.length, self.config.max_draft)
        else:
            self.length = max(1, min(accepted + 1, self.config.max_draft))
