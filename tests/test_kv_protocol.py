"""The scheduler's KV protocol: the real SchedulerCore (and its policy), KVAllocator and kv
update (apply_update, what the KV actor runs) against the executor's BlockTables, through
tests/scheduler_harness.py.

The fake executor writes each computed token into a simulated KV memory through the block
table it rebuilt from the round's deltas, so a wrong table, a wrong prefix-cache hit or a
shared block overwritten shows up as KV that does not hold the sequence's tokens.
"""

from __future__ import annotations

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler_harness import Harness
from zinfer.actors.kv_actor import apply_update
from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.scheduler_policy import SchedulerConfig
from zinfer.messages.engine import KvAllocate, KvUpdate, SeqError


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
    deltas = [s for r in h.sent_rounds for s in r.seqs]
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
    """Random admissions (some sharing prefixes), rounds, samples (some failed), failed rounds
    and aborts; every admitted sequence ends once (finished, failed or aborted)."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(SchedulerConfig(max_running=4, max_waiting=6, token_budget=12, max_model_len=48, block_size=4,
                                         num_blocks=10))
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

    @precondition(lambda self: not self.h.in_flight)
    @rule()
    def start_round(self):
        self.h.start_round()

    @precondition(lambda self: self.h.in_flight)
    @rule(data=st.data())
    def finish_round(self, data):
        ids = self.h.wanting_logits()
        tokens = data.draw(st.lists(st.integers(-1, 3), min_size=len(ids), max_size=len(ids)))  # -1: sampling failed
        drawn = dict(zip(ids, tokens))
        self.h.finish_round({i: t for i, t in drawn.items() if t >= 0}, {i: "nan" for i, t in drawn.items() if t < 0})

    @precondition(lambda self: self.h.in_flight)
    @rule()
    def fail_round(self):
        live = {s.seq_id for s in self.h.policy.running}
        ids = [s.seq_id for s in self.h.round_seqs() if s.seq_id in live]
        outputs = self.h.fail_round("device fault")
        assert [(o.seq_id, o.finish_reason, o.error) for o in outputs.outputs] == [
            (i, "error", SeqError("engine_failed", "device fault")) for i in ids]

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
        if h.in_flight:
            h.finish_round({seq_id: 7 for seq_id in h.wanting_logits()})
        h.run_until_idle()
        h.check()
        assert not h.policy.waiting and not h.policy.running
        assert h.alloc.num_used_blocks == 0  # only evictable cache is left
        ended = [set(h.finished), h.aborted, set(h.rejected)]
        assert sum(map(len, ended)) == h.next_id and set().union(*ended) == set(range(1, h.next_id + 1))


ProtocolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_protocol_state_machine = ProtocolMachine.TestCase
