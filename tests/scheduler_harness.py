"""The real SchedulerCore, driven as the scheduler actor drives it, over in-memory stand-ins of
the other actors: the real KVAllocator behind apply_update (what the KV actor runs), the
executor's BlockTables writing each computed token into a simulated KV memory, a sampler that
keeps a set of the sequences whose state it holds, and (with a draft model configured) the
drafter, a function from each DraftAsk to its DraftReply.

A wrong block table, a wrong prefix-cache hit or a shared block overwritten shows up as KV that
does not hold the sequence's tokens; a sampler update lost or sent twice as a sequence the
sampler does not know, or keeps after it ended.
"""

from __future__ import annotations

from typing import Callable

from zinfer.actors.executor_actor import BlockTables
from zinfer.actors.kv_actor import apply_update
from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.scheduler_core import RoundPlan, SchedulerCore
from zinfer.actors.scheduler_policy import SchedulerConfig, SchedulerPolicy
from zinfer.messages.engine import (
    Admit,
    DraftAsk,
    DraftReply,
    KvCommit,
    KvReply,
    KvStats,
    KvUpdate,
    Round,
    RoundFailed,
    RoundSeq,
    SamplerAdd,
    SamplerDrop,
    Sampled,
    SeqError,
    SeqOutputs,
    TokenSample,
)
from zinfer.messages.params import SamplingParams

EOS = 0


class Harness:
    """One scheduler and its fake peers; `finished` maps each ended sequence to its finish reason
    ("stop", "length", or "error:<message>": the harness's shorthand for finish reason "error" and its
    SeqError), `tokens` each sequence to the tokens it was sent."""

    def __init__(self, config: SchedulerConfig, prefix_caching: bool = True,
                 drafter: Callable[[DraftAsk], DraftReply] | None = None):
        self.config = config
        self.drafter = drafter
        self.core = SchedulerCore(config)
        self.alloc = KVAllocator(config.num_blocks, config.block_size, prefix_caching)
        self.tables = BlockTables()  # the executor's side
        self.memory = [[None] * config.block_size for _ in range(config.num_blocks)]  # token whose KV a slot holds
        self.sampler_seqs: set[int] = set()  # the sequences the sampler holds state for
        self.kv_updates: list[KvUpdate] = []
        self.sent_commits: list[KvCommit] = []
        self.sent_rounds: list[Round] = []
        self.preempted: list[int] = []
        self.idle_reports = 0  # SeqOutputs with no outputs: a round could not start
        self.finished: dict[int, str] = {}
        self.rejected: dict[int, str] = {}  # seq_id -> code
        self.aborted: set[int] = set()
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0

    @property
    def policy(self) -> SchedulerPolicy:
        return self.core.policy

    @property
    def in_flight(self) -> bool:
        return self.core.in_flight is not None

    def add(self, prompt: list[int], max_tokens: int, ignore_eos: bool = True, speculative: str | None = None) -> int:
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, speculative=speculative)
        rejected = self.core.admit(Admit(self.next_id, prompt, params, [EOS]))
        if rejected is not None:
            assert rejected.code in ("cannot_fit", "too_long", "queue_full"), rejected
            self.rejected[self.next_id] = rejected.code
        return self.next_id

    def abort(self, seq_id: int) -> None:
        if self.core.abort(seq_id):
            self.aborted.add(seq_id)

    def start_round(self) -> bool:
        """Step the core to its next round (the KV actor's part in between), send it to the fake
        executor. False when no round started."""
        step = self.core.schedule()
        while isinstance(step, (KvUpdate, DraftAsk)):
            if isinstance(step, DraftAsk):
                assert self.drafter is not None, "a draft ask without a drafter"
                self.core.drafted(self.drafter(step))
                step = self.core.schedule()
                continue
            self.kv_updates.append(step)
            self.sent_commits += step.commit
            grants = apply_update(self.alloc, step)
            stats = KvStats(self.alloc.num_blocks, self.alloc.num_used_blocks, self.alloc.num_cached_blocks)
            self.preempted += self.core.granted(KvReply(grants, stats))
            step = self.core.schedule()
        if isinstance(step, RoundPlan):
            self._execute(step.round)
            return True
        if isinstance(step, SeqOutputs):
            assert not step.outputs
            self.idle_reports += 1
            self._check_idle()
        return False

    def _check_idle(self) -> None:
        """No idle round while the queue's head could fit in every non-running block."""
        p = self.policy
        assert not p.running, "idle with running sequences"
        if p.waiting:
            head = p.waiting[0]
            end = min(len(head.all_ids), self.config.token_budget)
            need = self.alloc.num_blocks_needed(head.seq_id, end, head.all_ids)
            assert need > self.alloc.num_free_blocks, f"idle, but seq {head.seq_id} would fit"

    def _execute(self, r: Round) -> None:
        """The fake executor: rebuild tables from the deltas, write each token's KV."""
        self.sent_rounds.append(r)
        tables = self.tables.update(r)
        bs = self.config.block_size
        for s, table in zip(r.seqs, tables):
            seq = next(q for q in self.policy.running if q.seq_id == s.seq_id)
            assert table == seq.block_table == self.alloc.block_table(s.seq_id)
            others = {b for q in self.policy.running if q is not seq for b in q.block_table}
            for i, token in enumerate(s.token_ids):
                pos = s.start_pos + i
                block = table[pos // bs]
                assert block not in others, f"seq {s.seq_id} writes block {block} another sequence holds"
                self.memory[block][pos % bs] = token

    def wanting_logits(self) -> list[int]:
        return [s.seq_id for s in self.sent_rounds[-1].seqs if s.wants_logits]

    def round_seqs(self) -> list[RoundSeq]:
        return self.sent_rounds[-1].seqs

    def finish_round(self, tokens: dict[int, int], errors: dict[int, str] | None = None) -> None:
        """The round's samples come back: tokens[seq_id] for each sequence that wanted one, or
        errors[seq_id] for one whose sampling failed. The sampler applied the round's updates."""
        r = self.sent_rounds[-1]
        for u in r.sampler_updates:
            if isinstance(u, SamplerAdd):
                self.sampler_seqs.add(u.seq_id)
            else:
                self.sampler_seqs.discard(u.seq_id)
        wanting = self.wanting_logits()
        assert set(wanting) <= self.sampler_seqs, "the sampler has no state for a sequence it samples"
        errors = errors or {}
        samples = [TokenSample(i, tokens[i]) if i in tokens
                   else TokenSample(i, -1, error=SeqError("engine_failed", errors[i]))
                   for i in wanting]
        self._record(self.core.update(Sampled(r.round_id, samples)))

    def finish_round_greedy(self, model: Callable[[list[int]], int]) -> None:
        """The round's samples come back as a greedy sampler gives them for a fake model, the
        next token of a sequence being model(its tokens): one per sequence wanting logits, or
        for a drafted one each row's token up to the first that differs from the draft."""
        r = self.sent_rounds[-1]
        for u in r.sampler_updates:
            if isinstance(u, SamplerAdd):
                self.sampler_seqs.add(u.seq_id)
            else:
                self.sampler_seqs.discard(u.seq_id)
        samples = []
        for s in r.seqs:
            if not s.wants_logits:
                continue
            assert s.seq_id in self.sampler_seqs, "the sampler has no state for a sequence it samples"
            seq = next(q for q in self.policy.running if q.seq_id == s.seq_id)
            prefix, draft = list(seq.all_ids), s.token_ids[len(s.token_ids) - s.draft :] if s.draft else []
            for i in range(s.draft + 1):
                token = model(prefix)
                samples.append(TokenSample(s.seq_id, token))
                if i == s.draft or token != draft[i]:
                    break
                prefix.append(token)
        self._record(self.core.update(Sampled(r.round_id, samples)))

    def fail_round(self, message: str = "device fault") -> SeqOutputs:
        """The executor could not compute the round (its sampler updates never reach the sampler)."""
        outputs = self.core.fail_round(RoundFailed(self.sent_rounds[-1].round_id, message))
        self._record(outputs)
        return outputs

    def _record(self, outputs: SeqOutputs | None) -> None:
        for o in outputs.outputs if outputs is not None else []:
            ended = o.seq_id in self.finished or o.seq_id in self.aborted
            assert not ended, f"seq {o.seq_id} output after its end"
            self.tokens.setdefault(o.seq_id, []).extend(o.token_ids)
            if o.finish_reason is not None:
                self.finished[o.seq_id] = o.finish_reason if o.error is None else f"{o.finish_reason}:{o.error.message}"

    def run_until_idle(self, max_rounds: int = 5000, token: int = 7) -> None:
        for _ in range(max_rounds):
            if not self.start_round():
                return
            self.finish_round({seq_id: token for seq_id in self.wanting_logits()})
        raise AssertionError(f"still busy after {max_rounds} rounds")

    def check(self) -> None:
        """Only running sequences (or ones whose free is pending) hold blocks; every computed
        token's KV is in place; the executor keeps tables and the sampler state only for live
        sequences (or ones whose forget or drop is on its way)."""
        p, bs, core = self.policy, self.config.block_size, self.core
        self.alloc.check_invariants()
        running = {s.seq_id for s in p.running}
        for s in p.waiting:
            holds = s.seq_id not in core.frees and self.alloc.block_table(s.seq_id) != []
            assert not holds, f"waiting seq {s.seq_id} holds blocks"
        held = {b for s in p.running for b in s.block_table}
        pending = {b for seq_id in core.frees for b in self.alloc.block_table(seq_id)}
        truncating = {t.seq_id: t.num_tokens // bs for t in core.truncations}  # rejected drafts' blocks, going back
        pending |= {b for seq_id, keep in truncating.items() for b in self.alloc.block_table(seq_id)[keep:]}
        assert self.alloc.num_used_blocks == len(held | pending), "blocks held outside running sequences"
        for s in p.running:
            allocated = self.alloc.block_table(s.seq_id)
            assert s.block_table == allocated[: truncating.get(s.seq_id, len(allocated))]
            for pos in range(s.num_computed):
                assert self.memory[s.block_table[pos // bs]][pos % bs] == s.all_ids[pos], f"seq {s.seq_id} KV at {pos}"
        assert self.tables.seq_ids() <= running | set(core.forget), "the executor keeps a dead sequence's table"
        live = running | {s.seq_id for s in p.waiting}
        dropping = {u.seq_id for u in core.in_flight_updates + core.sampler_updates if isinstance(u, SamplerDrop)}
        assert self.sampler_seqs <= live | dropping, "the sampler keeps a dead sequence's state"
