"""The scheduling policy: pure state over sequences, no I/O (actors/scheduler_core.py runs the
round loop around it; the scheduler actor, actors/scheduler_actor.py, drives that).

Like vLLM V1 there is no prefill or decode phase. Each round gives each running
sequence some tokens to compute within a token budget: a whole prompt, the next chunk
of one, or the one token sampled last round. Sequences are served first come, first
served; when KV blocks run out the most recently admitted running sequence is
preempted (its blocks freed, its prompt + output recomputed later).

Invariants:
- a sequence is in exactly one of `waiting` (FIFO, bounded by max_waiting) or `running`
  (at most max_running), or in neither once finished or aborted;
- only running sequences hold KV blocks: the kv protocol grants asks in plan order up
  to the first refusal (actors/kv_actor.py apply_update), and `accept` admits exactly the
  granted new sequences, so a waiting sequence never holds a block and the queue's head
  always gets the next free blocks (first come, first served; no idle round while the
  head would fit);
- seq.num_computed tokens of seq.all_ids have KV in the blocks of seq.block_table;
- a running sequence's block table covers num_computed + the tokens of its round;
- seq.committed_blocks leading blocks are known to the allocator as written (commits
  carry only the blocks after them); seq.sent_blocks leading entries of its table are
  known to the executor (rounds carry only the entries after them);
- a sequence ends at min(max_model_len, the whole pool's tokens), so the oldest running
  sequence can always grow and every sequence finishes.

Speculative decoding (actors/speculation.py): a decoding sequence may carry a draft, tokens
computed after its last one in the same chunk; verification keeps a prefix of it, the KV of
the rest is dropped (num_computed stops at the kept tokens, and the blocks past the next
step's go back to the allocator as a KvTruncate).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import msgspec

from zinfer.actors.speculation import ModelDrafter, NgramDrafter, SpeculationConfig
from zinfer.messages.engine import KvAllocate, KvCommit, KvGrant, KvTruncate, RoundSeq
from zinfer.messages.params import SamplingParams


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_running: int = 64  # sequences in a round
    max_waiting: int = 256  # queued sequences before new ones are rejected
    token_budget: int = 512  # tokens computed per round (prefill chunk size)
    max_model_len: int = 2048  # context length: prompt + output
    block_size: int = 16
    num_blocks: int = 1024
    speculation: SpeculationConfig = msgspec.field(default_factory=SpeculationConfig)

    def validate(self) -> None:
        for name in ("max_running", "max_waiting", "token_budget", "max_model_len", "block_size", "num_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"scheduler.{name} must be >= 1")
        self.speculation.validate()


@dataclass
class Seq:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    traceparent: str | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    committed_blocks: int = 0  # leading blocks the allocator knows are full and written
    sent_blocks: int = 0  # leading block_table entries the executor has
    order: int = 0  # admission order: lower is older
    drafter: NgramDrafter | ModelDrafter | None = None  # its speculative drafts (None: it decodes plainly)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without copying the whole sequence (a decode step needs one id)."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:end] + self.output_ids[: max(end - n, 0)]


@dataclass
class Chunk:
    """A sequence's share of a planned round."""

    seq: Seq
    end: int  # the round computes all_ids[seq.num_computed:end - len(draft)], then draft
    new: bool  # admitted from the waiting queue by this round
    draft: list[int] = field(default_factory=list)  # speculative tokens after the sequence's last one


@dataclass
class Emitted:
    """A round's result for one sequence: the tokens it gained, and the drafted tokens kept."""

    token_ids: list[int]
    drafted: int
    accepted: int  # of token_ids, the drafted ones verification kept


@dataclass
class Finish:
    seq: Seq
    reason: str  # "stop" | "length"


@dataclass
class RoundResult:
    """What a finished round changed (SchedulerPolicy.complete)."""

    commits: list[KvCommit] = field(default_factory=list)  # KV blocks now full and written
    finished: list[Finish] = field(default_factory=list)  # already removed from `running`
    emitted: dict[int, Emitted] = field(default_factory=dict)  # seq id -> its new tokens (none mid-prefill)
    truncations: list[KvTruncate] = field(default_factory=list)  # rejected drafts' blocks to give back


class SchedulerPolicy:
    """Sequence state and round planning. Every method mutates only this object."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._order = itertools.count()
        # the longest a sequence may grow: past the pool's tokens it could never run
        self.max_len = min(config.max_model_len, config.num_blocks * config.block_size)

    # ---- admission ------------------------------------------------------------------

    def add(self, seq: Seq) -> tuple[str, str] | None:
        """Queue a new sequence; returns (code, message) when it is rejected instead."""
        cfg = self.config
        n = len(seq.prompt_ids)
        if n == 0:
            return "bad_request", "the prompt is empty"
        if n >= cfg.max_model_len:
            why = f"prompt has {n} tokens; the context is {cfg.max_model_len} (room for at least one new token needed)"
            return "too_long", why
        if -(-(n + 1) // cfg.block_size) > cfg.num_blocks:
            why = f"prompt of {n} tokens needs more KV blocks than the pool has ({cfg.num_blocks} of {cfg.block_size})"
            return "cannot_fit", why
        if len(self.waiting) >= cfg.max_waiting:
            return "queue_full", f"the waiting queue is full ({cfg.max_waiting} sequences)"
        mode = seq.params.speculative or cfg.speculation.mode
        if mode == "draft" and not cfg.speculation.draft_model:
            return "bad_request", 'speculative "draft" needs a server started with a draft model (--draft-model)'
        seq.order = next(self._order)
        seq.drafter = (NgramDrafter(cfg.speculation) if mode == "ngram" else
                       ModelDrafter(cfg.speculation) if mode == "draft" else None)
        self.waiting.append(seq)
        return None

    def abort(self, seq_id: int) -> Seq | None:
        """Remove a sequence wherever it is; returns it (the caller frees its KV) or None."""
        for queue in (self.running, self.waiting):
            for s in queue:
                if s.seq_id == seq_id:
                    queue.remove(s)
                    return s
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- planning -------------------------------------------------------------------

    def plan(self) -> list[Chunk]:
        """Choose this round's chunks: running sequences first, then admissions, in order."""
        budget = self.config.token_budget
        chunks = []
        drafting = len(self.running) <= self.config.speculation.max_batch
        for s in self.running:
            if budget <= 0:
                break
            n = min(len(s.prompt_ids) + len(s.output_ids) - s.num_computed, budget)
            if n > 0:
                draft = self._draft(s, budget - n) if n == 1 and drafting else []
                chunks.append(Chunk(s, s.num_computed + n + len(draft), False, draft))
                budget -= n + len(draft)
        slots = self.config.max_running - len(self.running)
        for s in itertools.islice(self.waiting, max(slots, 0)):
            if budget <= 0:
                break
            n = min(len(s.prompt_ids) + len(s.output_ids), budget)
            chunks.append(Chunk(s, n, new=True))
            budget -= n
        return chunks

    def model_drafts_wanted(self) -> list[tuple[Seq, int]]:
        """The running sequences whose next round decodes one token and whose draft model has
        not been asked since their last round, each with the most tokens it may draft (within
        max_tokens and max_len); none while more than max_batch sequences run."""
        if len(self.running) > self.config.speculation.max_batch:
            return []
        out = []
        for s in self.running:
            d, total = s.drafter, len(s.prompt_ids) + len(s.output_ids)
            if isinstance(d, ModelDrafter) and d.wants() and total - s.num_computed == 1:
                limit = min(d.length, s.params.max_tokens - len(s.output_ids) - 1, self.max_len - total - 1)
                if limit > 0:
                    out.append((s, limit))
        return out

    def _draft(self, s: Seq, budget: int) -> list[int]:
        """A draft for decoding sequence s, within budget tokens and short enough that every
        token it could yield stays within max_tokens and max_len; [] without a drafter."""
        if s.drafter is None:
            return []
        total = len(s.prompt_ids) + len(s.output_ids)
        limit = min(budget, s.params.max_tokens - len(s.output_ids) - 1, self.max_len - total - 1)
        return s.drafter.propose(s.all_ids, limit) if limit > 0 else []

    def kv_covered(self, chunks: list[Chunk]) -> bool:
        """True when every chunk is a running sequence whose block table already covers
        its round: the KV allocator would grant each one its table unchanged."""
        size = self.config.block_size
        return all(not c.new and c.end <= len(c.seq.block_table) * size for c in chunks)

    @staticmethod
    def kv_asks(chunks: list[Chunk]) -> list[KvAllocate]:
        return [KvAllocate(c.seq.seq_id, c.seq.all_ids if c.new else [], c.end) for c in chunks]

    def accept(self, chunks: list[Chunk], grants: list[KvGrant]) -> tuple[list[Chunk], list[Seq]]:
        """Apply the KV allocator's grants (one per chunk, in plan order) to a plan.

        Relies on the kv protocol: the grants are a prefix of oks followed only by
        refusals (ValueError otherwise). Granted new sequences move to `running`; the
        first refused one and everything behind it keep waiting, holding no blocks. When a
        running sequence was refused, the youngest running sequence is preempted and
        nothing runs: the caller frees the victim's blocks and plans again.

        Returns (chunks to run, sequences preempted now). Mutates the sequences' tables
        and the queues.
        """
        if [g.seq_id for g in grants] != [c.seq.seq_id for c in chunks]:
            raise ValueError("kv grants do not answer the plan's asks in order")
        refused = next((i for i, g in enumerate(grants) if not g.ok), len(grants))
        if any(g.ok for g in grants[refused:]):
            raise ValueError("kv protocol broken: a grant after a refusal")
        accepted: list[Chunk] = []
        for c, g in zip(chunks[:refused], grants):
            c.seq.block_table = list(g.block_table)
            if c.new:
                self.waiting.remove(c.seq)
                self.running.append(c.seq)
                c.seq.num_computed = c.seq.cached_tokens = g.cached_tokens
                c.seq.committed_blocks = g.cached_tokens // self.config.block_size
            if c.end > c.seq.num_computed:
                accepted.append(c)
        if refused < len(chunks) and not chunks[refused].new:
            victim = max(self.running, key=lambda s: s.order)
            self._preempt(victim)
            return [], [victim]
        return accepted, []

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.num_computed = seq.committed_blocks = seq.sent_blocks = 0
        seq.block_table = []
        if isinstance(seq.drafter, ModelDrafter):
            seq.drafter.reset()
        self.waiting.appendleft(seq)

    @staticmethod
    def round_seqs(chunks: list[Chunk]) -> list[RoundSeq]:
        """The round's messages: each carries only the table entries the executor lacks
        (and marks them sent)."""
        out = []
        for c in chunks:
            s = c.seq
            d = len(c.draft)
            wants = c.end - d == len(s.prompt_ids) + len(s.output_ids)
            new_blocks = s.block_table[s.sent_blocks :]
            tokens = s.tokens(s.num_computed, c.end - d) + c.draft
            out.append(RoundSeq(s.seq_id, tokens, s.num_computed, s.sent_blocks, new_blocks, wants, draft=d))
            s.sent_blocks = len(s.block_table)
        return out

    # ---- results --------------------------------------------------------------------

    def complete(self, chunks: list[Chunk], sampled: dict[int, list[int]]) -> RoundResult:
        """A round finished: advance computed counts, append sampled tokens, find finishes.

        sampled: each sequence's tokens, in order: one, or for a drafted chunk the draft's
        kept prefix and the token after it. Tokens past a finish (a stop token, max_tokens,
        max_len) are dropped. A drafted sequence's KV stops at its kept tokens and its table
        at the blocks its next step needs (the rest go in the result's truncations).
        Sequences aborted while the round ran are skipped. Mutates the sequences and `running`.
        """
        result = RoundResult()
        bs = self.config.block_size
        for c in chunks:
            s = c.seq
            if s not in self.running:
                continue
            tokens, d = sampled.get(s.seq_id, []), len(c.draft)
            kept = min(max(len(tokens) - 1, 0), d)
            reason = None
            emitted = []
            for token in tokens:
                s.output_ids.append(token)
                emitted.append(token)
                reason = self._finish_reason(s, token)
                if reason:
                    break
            s.num_computed = min(c.end - d + kept, len(s.prompt_ids) + len(s.output_ids) - (1 if emitted else 0))
            if emitted:
                result.emitted[s.seq_id] = Emitted(emitted, d, min(kept, len(emitted)))
            if s.drafter is not None:
                s.drafter.verified(d, kept)
            full = s.num_computed // bs  # only full blocks enter the prefix cache
            if full > s.committed_blocks:
                commit = KvCommit(s.seq_id, s.committed_blocks, s.tokens(s.committed_blocks * bs, full * bs))
                result.commits.append(commit)
                s.committed_blocks = full
            if reason:
                self.running.remove(s)
                result.finished.append(Finish(s, reason))
            elif d:
                self._truncate(s, result)
        return result

    def _truncate(self, s: Seq, result: RoundResult) -> None:
        """Drop s's blocks past those its next step needs (its tokens + 1), telling the executor
        and, through result, the allocator."""
        keep = -(-(len(s.prompt_ids) + len(s.output_ids)) // self.config.block_size)
        if len(s.block_table) > keep:
            del s.block_table[keep:]
            s.sent_blocks = min(s.sent_blocks, keep)
            result.truncations.append(KvTruncate(s.seq_id, keep * self.config.block_size))

    def _finish_reason(self, s: Seq, token: int | None) -> str | None:
        if token is None:
            return None
        p = s.params
        if (token in s.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(s.output_ids) >= p.max_tokens or len(s.prompt_ids) + len(s.output_ids) >= self.max_len:
            return "length"
        return None
