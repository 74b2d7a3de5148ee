"""The scheduler's KV protocol under a fake executor: the real SchedulerPolicy, KVAllocator,
kv update (apply_update, what the KV actor runs) and the executor's BlockTables.

The fake executor writes each computed token into a simulated KV memory through the
block table it rebuilt from the round's deltas, so a wrong table, a wrong prefix-cache
hit or a shared block overwritten shows up as KV that does not hold the sequence's tokens.
"""

from __future__ import annotations

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from zinfer.actors.executor import BlockTables
from zinfer.actors.kv import apply_update
from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.scheduler_policy import Chunk, SchedulerConfig, SchedulerPolicy, Seq
from zinfer.messages.engine import KvAllocate, KvCommit, KvGrant, KvUpdate, Round, RoundSeq
from zinfer.messages.params import SamplingParams

EOS = 0


class Harness:
    """The scheduler actor's round loop (start_round / _complete) over in-memory parts."""

    def __init__(self, config: SchedulerConfig, prefix_caching: bool = True):
        self.config = config
        self.policy = SchedulerPolicy(config)
        self.alloc = KVAllocator(config.num_blocks, config.block_size, prefix_caching)
        self.tables = BlockTables()  # the executor's side
        self.memory = [[None] * config.block_size for _ in range(config.num_blocks)]  # token whose KV a slot holds
        self.frees: list[int] = []
        self.commits: list[KvCommit] = []
        self.forget: list[int] = []
        self.in_flight: list[Chunk] | None = None
        self.sent_commits: list[KvCommit] = []
        self.sent_rounds: list[list[RoundSeq]] = []
        self.finished: dict[int, str] = {}
        self.next_id = 0
        self.round_id = 0

    def add(self, prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> int:
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        rejected = self.policy.add(Seq(self.next_id, prompt, params, frozenset({EOS})))
        if rejected:
            assert rejected[0] in ("cannot_fit", "too_long", "queue_full"), rejected
        return self.next_id

    def abort(self, seq_id: int) -> None:
        if self.policy.abort(seq_id) is not None:
            self.frees.append(seq_id)
            self.forget.append(seq_id)

    def _kv_update(self, chunks: list[Chunk]) -> list[KvGrant]:
        update = KvUpdate(self.frees, self.commits, self.policy.kv_asks(chunks))
        self.sent_commits += self.commits
        self.frees, self.commits = [], []
        return apply_update(self.alloc, update)

    def start_round(self) -> bool:
        """Plan, get blocks, send the round to the fake executor. False when idle."""
        p = self.policy
        while True:
            chunks = p.plan()
            if not chunks and not (self.frees or self.commits):
                return False
            if self.frees or self.commits or not p.kv_covered(chunks):
                grants = self._kv_update(chunks)
            else:
                grants = [KvGrant(c.seq.seq_id, True, c.seq.block_table) for c in chunks]
            accepted, victims = p.accept(chunks, grants)
            if victims:
                self.frees = [v.seq_id for v in victims]
                self.forget += self.frees
                continue
            if accepted:
                break
            if any(c.new and c.seq in p.running for c in chunks):
                continue
            self._check_idle()
            return False
        self.round_id += 1
        seqs = p.round_seqs(accepted)
        self._execute(Round(self.round_id, seqs, forget=self.forget))
        self.forget = []
        self.in_flight = accepted
        return True

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
        self.sent_rounds.append(r.seqs)
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

    def finish_round(self, tokens: dict[int, int]) -> None:
        """The round's samples come back: tokens[seq_id] for each sequence that wanted one."""
        chunks, self.in_flight = self.in_flight, None
        commits, finished = self.policy.complete(chunks, tokens)
        self.commits += commits
        for f in finished:
            self.finished[f.seq.seq_id] = f.reason
            self.frees.append(f.seq.seq_id)
            self.forget.append(f.seq.seq_id)

    def wanting_logits(self) -> list[int]:
        return [s.seq_id for s in self.sent_rounds[-1] if s.wants_logits]

    def run_until_idle(self, max_rounds: int = 5000, token: int = 7) -> None:
        for _ in range(max_rounds):
            if not self.start_round():
                return
            self.finish_round({seq_id: token for seq_id in self.wanting_logits()})
        raise AssertionError(f"still busy after {max_rounds} rounds")

    def check(self) -> None:
        """Only running sequences (or ones whose free is pending) hold blocks; every computed
        token's KV is in place; the executor keeps tables only for live sequences."""
        p, bs = self.policy, self.config.block_size
        self.alloc.check_invariants()
        running = {s.seq_id for s in p.running}
        for s in p.waiting:
            assert s.seq_id in self.frees or self.alloc.block_table(s.seq_id) == [], f"waiting seq {s.seq_id} holds blocks"
        held = {b for s in p.running for b in s.block_table}
        pending = {b for seq_id in self.frees for b in self.alloc.block_table(seq_id)}
        assert self.alloc.num_used_blocks == len(held | pending), "blocks held outside running sequences"
        for s in p.running:
            assert s.block_table == self.alloc.block_table(s.seq_id)
            for pos in range(s.num_computed):
                assert self.memory[s.block_table[pos // bs]][pos % bs] == s.all_ids[pos], f"seq {s.seq_id} KV at {pos}"
        executor_ids = self.tables.seq_ids()
        assert executor_ids <= running | set(self.forget), "the executor keeps a dead sequence's table"


def test_refused_head_leaves_later_asks_without_blocks_and_nothing_stalls():
    """Pool of 6 blocks, R running; A (needs all 6) queues, then B (3 tokens). Before the
    fix B got a block while waiting, so once R finished A could never fit and B never ran."""
    h = Harness(SchedulerConfig(max_running=4, token_budget=64, max_model_len=64, block_size=4, num_blocks=6))
    r = h.add([1, 2, 3, 4, 5], max_tokens=2)
    assert h.start_round()  # R prefills
    h.finish_round({r: 7})
    a = h.add(list(range(10, 33)), max_tokens=1)  # 23 tokens: 6 blocks
    b = h.add([1, 2, 3], max_tokens=1)
    assert h.start_round()  # R decodes; A is refused, and B, behind it, with it
    assert h.alloc.block_table(b) == [] and h.alloc.block_table(a) == []
    h.check()
    h.finish_round({r: 7})  # R finishes
    h.run_until_idle()
    assert h.finished == {r: "length", a: "length", b: "length"}
    assert not h.policy.has_work and h.alloc.num_used_blocks == 0


def test_update_refuses_every_ask_after_the_first_refusal():
    """A running sequence refused mid-update: the ask behind it gets nothing either."""
    alloc = KVAllocator(4, 4)
    assert alloc.allocate(1, [5] * 12, 12) == 0  # 3 of 4 blocks
    asks = [KvAllocate(1, [], 20), KvAllocate(2, [1, 2, 3], 3)]  # 2 more blocks for seq 1; seq 2 would fit
    grants = apply_update(alloc, KvUpdate(allocate=asks))
    assert [g.ok for g in grants] == [False, False]
    assert alloc.block_table(2) == [] and alloc.num_free_blocks == 1


def test_sequences_longer_than_the_pool_end_at_its_size():
    """A sequence that would outgrow the whole pool ends with "length" when it fills it;
    before, it preempted itself and recomputed forever."""
    h = Harness(SchedulerConfig(max_running=4, token_budget=64, max_model_len=64, block_size=4, num_blocks=4))
    s1 = h.add([1, 2, 3, 4, 5, 6, 7], max_tokens=50)
    s2 = h.add([1, 2, 3], max_tokens=50)
    for _ in range(500):
        if not h.start_round():
            break
        h.check()
        h.finish_round({seq_id: 7 for seq_id in h.wanting_logits()})
    assert h.finished == {s1: "length", s2: "length"}
    assert not h.policy.has_work and h.alloc.num_used_blocks == 0


def test_commits_and_round_deltas_carry_only_what_changed():
    bs = 4
    h = Harness(SchedulerConfig(max_running=4, token_budget=8, max_model_len=512, block_size=bs, num_blocks=128))
    seq_id = h.add(list(range(1, 31)), max_tokens=300)  # 30 prompt tokens, prefilled in chunks of 8
    h.run_until_idle()
    assert h.finished == {seq_id: "length"}
    total = 30 + 300
    assert all(len(c.token_ids) % bs == 0 and 0 < len(c.token_ids) <= 8 + bs for c in h.sent_commits)
    assert sum(len(c.token_ids) for c in h.sent_commits) == (total - 1) // bs * bs  # each full block once
    firsts = [c.first_block for c in h.sent_commits]
    assert firsts == sorted(firsts) and firsts[0] == 0
    deltas = [s for seqs in h.sent_rounds for s in seqs]
    assert all(len(s.new_blocks) <= 3 for s in deltas)  # a chunk of 8 touches at most 3 blocks
    assert sum(len(s.new_blocks) for s in deltas) == -(-(total - 1) // bs)  # each block sent once
    decode = [s for s in deltas if len(s.token_ids) == 1]
    assert sum(not s.new_blocks for s in decode) >= len(decode) * (bs - 1) // bs - 1


def test_prefix_hit_counts_as_committed_and_the_next_commit_follows_it():
    bs = 4
    h = Harness(SchedulerConfig(max_running=4, token_budget=64, max_model_len=128, block_size=bs, num_blocks=32))
    prompt = list(range(1, 18))  # 17 tokens: 4 full blocks
    first = h.add(prompt, max_tokens=1)
    h.run_until_idle()
    second = h.add(prompt + [9, 9, 9], max_tokens=8)
    h.sent_commits.clear()
    h.run_until_idle()
    assert h.finished[first] == h.finished[second] == "length"
    mine = [c for c in h.sent_commits if c.seq_id == second]
    assert mine[0].first_block == 4  # the 4 cached blocks are not sent again
    assert sum(len(c.token_ids) for c in mine) == (20 + 8 - 1) // bs * bs - 16


# ---- stateful check ------------------------------------------------------------------

prompt_st = st.lists(st.integers(1, 2), min_size=1, max_size=30)


class ProtocolMachine(RuleBasedStateMachine):
    """Random admissions (some sharing prefixes), rounds, samples and aborts."""

    def __init__(self) -> None:
        super().__init__()
        config = SchedulerConfig(max_running=4, max_waiting=6, token_budget=12, max_model_len=48, block_size=4, num_blocks=10)
        self.h = Harness(config)
        self.prompts: list[list[int]] = []

    @rule(prompt=prompt_st, max_tokens=st.integers(1, 24), ignore_eos=st.booleans())
    def admit(self, prompt, max_tokens, ignore_eos):
        self.h.add(prompt, max_tokens, ignore_eos)
        self.prompts.append(prompt)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), tail=st.lists(st.integers(1, 2), max_size=8), max_tokens=st.integers(1, 24))
    def admit_shared_prefix(self, data, tail, max_tokens):
        base = data.draw(st.sampled_from(self.prompts))
        prompt = base[: data.draw(st.integers(0, len(base)))] + tail or [1]
        self.h.add(prompt, max_tokens)
        self.prompts.append(prompt)

    @precondition(lambda self: self.h.in_flight is None)
    @rule()
    def start_round(self):
        self.h.start_round()

    @precondition(lambda self: self.h.in_flight is not None)
    @rule(data=st.data())
    def finish_round(self, data):
        ids = self.h.wanting_logits()
        tokens = data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)))
        self.h.finish_round(dict(zip(ids, tokens)))

    @precondition(lambda self: self.h.policy.has_work)
    @rule(data=st.data())
    def abort(self, data):
        seqs = list(self.h.policy.running) + list(self.h.policy.waiting)
        self.h.abort(data.draw(st.sampled_from(seqs)).seq_id)

    @invariant()
    def protocol_holds(self):
        self.h.check()

    def teardown(self):
        h = self.h
        if h.in_flight is not None:
            h.finish_round({seq_id: 7 for seq_id in h.wanting_logits()})
        h.run_until_idle()
        h.check()
        assert not h.policy.waiting and not h.policy.running
        assert h.alloc.num_used_blocks == 0  # only evictable cache is left


ProtocolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_protocol_state_machine = ProtocolMachine.TestCase
