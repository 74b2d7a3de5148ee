"""A draft model's proposals for speculative decoding: its own KV pool and per-sequence state.

Pure computation over a run function (forward one batch, logits rows on the host), no I/O; the
drafter actor (actors/draft_actor.py) owns the device and calls `propose` in a worker thread.

Per sequence it keeps the tokens it knows (the target's sequence as last told, then its own
proposal) and how many of them have KV in its pool. An ask tells it the sequence as the target
has it now: a prefix of what it knew (`start` tokens) and the rest. The tokens that still agree
with what it knew keep their KV, the rest are truncated (rejected drafts' KV leaves this pool
too); then one catch-up chunk per sequence computes the tokens it lacks (split into rounds of at
most `token_budget` tokens), and its last row gives the first proposed token. Each further token
is one one-row step, all drafting sequences batched together, until a sequence has `limit`
tokens or its next token would bring the product of its proposed tokens' probabilities (the
draft's odds that the round keeps all of it) under p_min (that token is not proposed).

Greedy requests get argmax proposals; sampled ones (temperature > 0) get tokens drawn from
q = softmax(logits / temperature), and q comes back with them: the sampler accepts each with
min(1, p/q) and resamples from max(0, p - q) (actors/speculation_verify.py), which keeps the
target's distribution exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from zinfer.actors.kv_allocator import KVAllocator
from zinfer.messages.engine import DraftAsk, DraftProposal, DraftReply, DraftSeq

Chunk = tuple[list[int], int, list[int], bool]
"""A sequence's part of a draft round: (token ids, position of the first, block table, wants logits)."""
RunRound = Callable[[list[Chunk], str], np.ndarray]
"""run(chunks, kind) -> logits [rows, vocab] float32 on the host, one row per chunk that wants
logits, in order; kind is "append" (catch-up chunks) or "decode" (one-row steps), for the trace."""


@dataclass
class DraftState:
    """What the drafter holds of one sequence: ids [n] (known tokens, its last proposal at the
    end) of which the first `computed` have KV in its pool."""

    ids: list[int] = field(default_factory=list)
    computed: int = 0
    rng: np.random.Generator | None = None  # sampled proposals' draws (seeded per request)


@dataclass
class _Live:
    """A sequence drafting in this ask."""

    seq_id: int
    ask: DraftSeq
    state: DraftState
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)  # q rows of sampled proposals, [vocab] float32 each
    known: int = 0  # leading tokens of the sequence the drafter holds (0: dropped)
    limit: int = 0  # the most tokens to propose
    kept: float = 1.0  # the product of the proposed tokens' top probabilities: the draft's odds that all are kept


class DraftModel:
    """The drafting state of every sequence over one KV pool of num_blocks blocks.

    vocab: proposals are ids below it (the tokenizer's size both models share; padded
    embedding rows past it are never proposed). max_len: the draft model's context; nothing
    is proposed past it. Every method mutates only this object (and its allocator)."""

    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, p_min: float,
                 token_budget: int = 512, head: np.ndarray | None = None):
        self.alloc = KVAllocator(num_blocks, block_size, prefix_caching=False)
        self.block_size, self.vocab, self.max_len, self.p_min = block_size, vocab, max_len, p_min
        self.head = head  # [H] int64: the token id of each logits column (actors/draft_head.py); None: column i is id i
        self.token_budget = max(1, token_budget)
        self.states: dict[int, DraftState] = {}

    def forget(self, seq_id: int) -> None:
        """Drop a sequence (ended or preempted) and free its blocks; unknown ids are a no-op."""
        self.states.pop(seq_id, None)
        self.alloc.free(seq_id)

    def propose(self, ask: DraftAsk, run: RunRound) -> DraftReply:
        """Forget ask.forget, then a proposal per ask.seqs (in order). A sequence the pool cannot
        hold, or told from a start past what is known of it, gets none and is dropped (known 0).
        Raises what run raises (the caller fails the ask and forgets its sequences)."""
        for seq_id in ask.forget:
            self.forget(seq_id)
        live = [self._sync(ds) for ds in ask.seqs]
        active = [x for x in live if x is not None and x.limit > 0 and self._grow(x)]
        rows = self._catch_up(active, run)  # [len(active)] last rows
        while active:
            going = [x for x, row in zip(active, rows) if self._next(x, self._columns(row)) and len(x.tokens) < x.limit]
            active = [x for x in going if self._grow(x)]
            if active:
                rows = list(run(self._batch([(x, x.state.ids[-1:]) for x in active], [True] * len(active)), "decode"))
                for x in active:
                    x.state.computed = len(x.state.ids)
        out = []
        for ds, item in zip(ask.seqs, live):
            if item is None:
                out.append(DraftProposal(ds.seq_id, [], 0))
            else:
                probs = np.stack(item.probs) if item.probs else None  # [k, vocab] float32
                out.append(DraftProposal(ds.seq_id, item.tokens, item.known, probs))
        return DraftReply(out)

    # ---- internals ------------------------------------------------------------------

    def _sync(self, ds: DraftSeq) -> _Live | None:
        """Bring a sequence's state to the target's tokens; its KV stops where they disagree.
        None: told from a start past what it knows (dropped; the next ask starts over)."""
        st = self.states.get(ds.seq_id)
        if st is None or ds.start > len(st.ids):
            self.forget(ds.seq_id)
            if ds.start != 0:
                return None
            st = DraftState(rng=np.random.default_rng(None if ds.seed is None else ds.seed % 2**64))
            self.states[ds.seq_id] = st
        same = 0
        for a, b in zip(st.ids[ds.start :], ds.token_ids):
            if a != b:
                break
            same += 1
        st.ids = st.ids[: ds.start] + list(ds.token_ids)
        st.computed = max(0, min(st.computed, ds.start + same, len(st.ids) - 1))  # the last token is always fed
        self.alloc.truncate(ds.seq_id, st.computed)
        n = len(st.ids)
        limit = min(ds.limit, self.max_len - n) if n else 0
        return _Live(ds.seq_id, ds, st, known=n, limit=limit)

    def _grow(self, x: _Live) -> bool:
        """Blocks for all of x's known tokens (the next round computes up to its last); False,
        x dropped (it proposes what it has, known 0), when the pool is out of blocks."""
        if self.alloc.allocate(x.seq_id, [], len(x.state.ids)) is not None:
            return True
        self.forget(x.seq_id)
        x.known = 0
        return False

    def _catch_up(self, live: list[_Live], run: RunRound) -> list[np.ndarray]:
        """Compute each sequence's missing tokens, in rounds of at most token_budget tokens;
        returns each one's last logits row [vocab], in order."""
        last: dict[int, np.ndarray] = {}
        todo = list(live)
        while todo:
            budget, chunks = self.token_budget, []
            for x in todo:
                if budget <= 0:
                    break
                st = x.state
                n = min(len(st.ids) - st.computed, budget)
                chunks.append((x, st.ids[st.computed : st.computed + n]))
                budget -= n
            wants = [x.state.computed + len(tokens) == len(x.state.ids) for x, tokens in chunks]
            rows = run(self._batch(chunks, wants), "append")  # [sum(wants), vocab]
            r = 0
            for (x, tokens), w in zip(chunks, wants):
                x.state.computed += len(tokens)
                if w:
                    last[x.seq_id] = rows[r]
                    r += 1
            todo = [x for x in todo if x.state.computed < len(x.state.ids)]
        return [last[x.seq_id] for x in live]

    def _batch(self, chunks: list[tuple[_Live, list[int]]], wants: list[bool]) -> list[Chunk]:
        """The round's chunks (tokens from each sequence's computed position on)."""
        return [(tokens, x.state.computed, self.alloc.block_table(x.seq_id), w)
                for (x, tokens), w in zip(chunks, wants)]

    def _columns(self, row: np.ndarray) -> np.ndarray:
        """The logits row's columns a proposal may take: [H] for a cut head, else [vocab]."""
        return row if self.head is not None else row[: self.vocab]

    def _next(self, x: _Live, z: np.ndarray) -> bool:
        """Propose x's next token from its logits row z ([H] or [vocab], as _columns); False
        when its probability is under p_min (nothing proposed) and x stops. With a cut head the
        probabilities are those of the softmax over its columns (each id left out has q = 0)."""
        z = z.astype(np.float64)  # [vocab]
        t = x.ask.temperature
        if not np.isfinite(z).all():
            return False
        if t == 0.0:
            column = int(np.argmax(z))
            top = 1.0 / float(np.exp(z - z[column]).sum())
            if x.kept * top < self.p_min:
                return False
            token = self._token(column)
        else:
            e = np.exp((z - z.max()) / t)
            q = e / e.sum()  # [vocab]
            top = float(q.max())
            if x.kept * top < self.p_min:
                return False
            assert x.state.rng is not None
            cdf = np.cumsum(q)
            drawn = int(np.searchsorted(cdf, x.state.rng.random() * cdf[-1], side="right"))
            token = self._token(min(drawn, q.size - 1))
            if self.head is not None:
                q_ids = np.zeros(self.vocab, np.float64)  # [vocab]
                q_ids[self.head] = q
                q = q_ids
            x.probs.append(q.astype(np.float32))
        x.kept *= top
        x.tokens.append(token)
        x.state.ids.append(token)
        return True

    def _token(self, column: int) -> int:
        """The token id of a logits column."""
        return column if self.head is None else int(self.head[column])
