"""The paged-KV allocator: prefix sharing, admission failure, LRU eviction, and a stateful
model check that simulates the executor's KV memory to catch corrupted prefix hits."""

from __future__ import annotations

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from zinfer.actors.kv_allocator import KVAllocator


def _admit_and_compute(kv: KVAllocator, seq_id: int, tokens: list[int]) -> int:
    cached = kv.allocate(seq_id, tokens, len(tokens))
    assert cached is not None
    full = len(tokens) // kv.block_size
    kv.commit(seq_id, 0, tokens[: full * kv.block_size])
    return cached


def test_shared_three_block_prefix_shares_block_ids():
    kv = KVAllocator(num_blocks=16, block_size=4)
    prefix = list(range(100, 112))  # 3 full blocks
    a, b = prefix + [1, 2], prefix + [7, 8, 9]
    assert _admit_and_compute(kv, 1, a) == 0
    assert kv.allocate(2, b, len(b)) == 12
    assert kv.block_table(2)[:3] == kv.block_table(1)[:3]
    assert kv.block_table(2)[3] != kv.block_table(1)[3]
    assert kv.num_used_blocks == 5
    kv.check_invariants()


def test_prompt_of_exactly_two_full_blocks_leaves_one_block_to_compute():
    kv = KVAllocator(num_blocks=8, block_size=4)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    _admit_and_compute(kv, 1, prompt)
    assert kv.allocate(2, prompt, len(prompt)) == 4
    assert len(kv.block_table(2)) == 2
    kv.check_invariants()


def test_allocate_returns_none_without_side_effects_when_exhausted():
    kv = KVAllocator(num_blocks=4, block_size=4)
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    _admit_and_compute(kv, 1, shared + [9])  # 3 blocks, 2 of them registered
    kv.free(1)  # 2 cached (evictable) + 2 free
    _admit_and_compute(kv, 2, list(range(20, 29)))  # takes the 2 free blocks and evicts one
    before = (kv.num_free_blocks, kv.num_cached_blocks, kv.block_table(2))
    # would hit the one cached block left but needs 4 more: must not take the hit
    assert kv.allocate(3, shared + list(range(30, 42)), 20) is None
    assert kv.block_table(3) == []
    assert (kv.num_free_blocks, kv.num_cached_blocks, kv.block_table(2)) == before
    assert kv.allocate(2, [20, 21, 22, 23, 24], 200) is None  # an extension that cannot fit
    assert (kv.num_free_blocks, kv.num_cached_blocks, kv.block_table(2)) == before
    kv.check_invariants()
    kv.free(2)
    assert kv.allocate(3, shared + [0], 9) == 4  # the surviving cached first block
    kv.check_invariants()


def test_evicts_least_recently_freed_first():
    kv = KVAllocator(num_blocks=3, block_size=2)
    for seq_id, tok in ((1, 1), (2, 2), (3, 3)):
        _admit_and_compute(kv, seq_id, [tok, tok])
    for seq_id in (1, 2, 3):
        kv.free(seq_id)
    assert kv.num_free_blocks == 3 and kv.num_cached_blocks == 3
    _admit_and_compute(kv, 4, [4, 4, 4])  # needs 2 fresh blocks: evicts seq 1's, then seq 2's
    assert kv.num_cached_blocks == 2  # seq 3's block and the new full one
    kv.free(4)
    assert kv.allocate(5, [3, 3, 0], 3) == 2  # seq 3's block, freed last, survived
    kv.free(5)
    assert kv.allocate(6, [1, 1, 0], 3) == 0
    kv.free(6)
    assert kv.allocate(7, [2, 2, 0], 3) == 0
    kv.check_invariants()


def test_free_releases_tail_blocks_before_prefix_blocks():
    kv = KVAllocator(num_blocks=3, block_size=2)
    _admit_and_compute(kv, 1, [1, 2, 3, 4, 5])  # 2 full blocks registered + 1 partial
    kv.free(1)  # partial -> free list; full blocks evictable, tail first
    _admit_and_compute(kv, 2, [9, 9, 9])  # free block, then evicts the tail full block
    assert kv.allocate(3, [1, 2, 3, 4, 5], 5) is None  # needs 2 fresh blocks, only 1 free
    assert kv.allocate(3, [1, 2, 3, 4, 5], 2) == 2  # the first block survived
    kv.check_invariants()


def test_num_blocks_needed_predicts_allocate():
    kv = KVAllocator(num_blocks=8, block_size=4)
    prompt = list(range(10))
    _admit_and_compute(kv, 1, prompt)
    assert kv.num_blocks_needed(2, 10) == 3
    assert kv.num_blocks_needed(2, 10, prompt) == 1  # 2 blocks shared, in use: free to take
    assert kv.num_blocks_needed(1, 13) == 1 and kv.num_blocks_needed(1, 12) == 0
    free = kv.num_free_blocks
    assert kv.allocate(2, prompt, 10) == 8
    assert free - kv.num_free_blocks == 1


def test_prefix_caching_off_never_shares():
    kv = KVAllocator(num_blocks=8, block_size=4, prefix_caching=False)
    prompt = list(range(10))
    _admit_and_compute(kv, 1, prompt)
    assert kv.allocate(2, prompt, 10) == 0
    assert set(kv.block_table(1)).isdisjoint(kv.block_table(2))
    kv.free(1)
    kv.free(2)
    assert kv.num_free_blocks == 8 and kv.num_cached_blocks == 0
    kv.check_invariants()


def test_commits_carry_only_new_blocks_and_refuse_a_gap():
    kv = KVAllocator(num_blocks=8, block_size=4)
    tokens = list(range(100, 116))  # 4 blocks
    assert kv.allocate(1, tokens, 16) == 0
    kv.commit(1, 0, tokens[:4])
    kv.commit(1, 1, tokens[4:12])  # two blocks in one commit
    with pytest.raises(ValueError):
        kv.commit(1, 4, [0] * 4)  # block 3 was never committed: a gap
    kv.commit(1, 3, tokens[12:16])  # the 4th block, right after the three committed
    kv.free(1)
    assert kv.allocate(2, tokens + [7], 17) == 16  # the whole chain was registered
    kv.check_invariants()


def test_free_unknown_sequence_is_noop():
    kv = KVAllocator(num_blocks=2, block_size=4)
    kv.free(123)
    assert kv.num_free_blocks == 2 and kv.usage == 0.0


# ---- stateful model check ----------------------------------------------------------

NUM_BLOCKS, BLOCK_SIZE = 16, 4
tokens_st = st.lists(st.integers(0, 1), min_size=1, max_size=10)


class AllocatorMachine(RuleBasedStateMachine):
    """Random admit/fork/extend/compute/free/preempt against a simulated KV memory.

    `memory[block][slot]` is the token whose KV the executor last wrote there. A prefix
    hit must hand out blocks whose memory holds exactly the prompt's tokens, and a
    computed token must never land in a block another sequence also holds.
    """

    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVAllocator(NUM_BLOCKS, BLOCK_SIZE)
        self.memory = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]
        self.tokens: dict[int, list[int]] = {}
        self.computed: dict[int, int] = {}
        self.committed: dict[int, int] = {}  # leading blocks committed, as the scheduler counts them
        self.next_id = 0

    def _allocate_new(self, seq_id: int, toks: list[int], n: int) -> bool:
        free_before = self.kv.num_free_blocks
        need = self.kv.num_blocks_needed(seq_id, n, toks)
        cached = self.kv.allocate(seq_id, toks, n)
        if cached is None:
            assert need > free_before
            assert self.kv.num_free_blocks == free_before and self.kv.block_table(seq_id) == []
            return False
        assert need == free_before - self.kv.num_free_blocks
        assert cached % BLOCK_SIZE == 0 and cached < len(toks)
        table = self.kv.block_table(seq_id)
        assert len(table) * BLOCK_SIZE >= max(n, cached)
        for t in range(cached):  # the KV handed out is the KV of these very tokens
            assert self.memory[table[t // BLOCK_SIZE]][t % BLOCK_SIZE] == toks[t]
        self.tokens[seq_id], self.computed[seq_id] = toks, cached
        self.committed[seq_id] = cached // BLOCK_SIZE  # cache hits count as committed
        return True

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    @rule(target=seqs, toks=tokens_st, frac=st.floats(0.0, 1.0))
    def admit(self, toks, frac):
        seq_id = self._new_id()
        n = max(1, round(len(toks) * frac))  # a first prefill chunk
        return seq_id if self._allocate_new(seq_id, toks, n) else multiple()

    @precondition(lambda self: self.tokens)
    @rule(target=seqs, data=st.data(), tail=tokens_st)
    def fork(self, data, tail):
        """A new prompt sharing a prefix with a live one: drives prefix hits."""
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens[parent][: data.draw(st.integers(0, len(self.tokens[parent])))] + tail
        seq_id = self._new_id()
        return seq_id if self._allocate_new(seq_id, toks, len(toks)) else multiple()

    @rule(seq_id=seqs, more=st.lists(st.integers(0, 1), max_size=5))
    def extend(self, seq_id, more):
        """Append generated tokens and grow the allocation to cover all of them."""
        if seq_id not in self.tokens:
            return
        toks = self.tokens[seq_id] + more
        free_before, table_before = self.kv.num_free_blocks, self.kv.block_table(seq_id)
        need = self.kv.num_blocks_needed(seq_id, len(toks))
        if self.kv.allocate(seq_id, toks, len(toks)) is None:
            assert need > free_before
            assert self.kv.block_table(seq_id) == table_before
        else:
            assert need == free_before - self.kv.num_free_blocks
            assert self.kv.block_table(seq_id)[: len(table_before)] == table_before
            self.tokens[seq_id] = toks

    @rule(seq_id=seqs, data=st.data())
    def compute(self, seq_id, data):
        """The executor writes KV for the next tokens covered by the block table."""
        if seq_id not in self.tokens:
            return
        toks, done = self.tokens[seq_id], self.computed[seq_id]
        end = min(len(toks), len(self.kv.block_table(seq_id)) * BLOCK_SIZE)
        self._write(seq_id, data.draw(st.one_of(st.just(end), st.integers(done, end))))

    def _write(self, seq_id: int, k: int) -> None:
        """Write KV for tokens [computed, k) of seq_id, then commit them."""
        toks, done = self.tokens[seq_id], self.computed[seq_id]
        table = self.kv.block_table(seq_id)
        others = {b for s in self.tokens if s != seq_id for b in self.kv.block_table(s)}
        for t in range(done, k):
            block = table[t // BLOCK_SIZE]
            assert block not in others, f"seq {seq_id} would overwrite shared block {block}"
            self.memory[block][t % BLOCK_SIZE] = toks[t]
        first, full = self.committed[seq_id], k // BLOCK_SIZE
        self.kv.commit(seq_id, first, toks[first * BLOCK_SIZE : full * BLOCK_SIZE])  # only the new blocks
        self.committed[seq_id] = max(first, full)
        self.computed[seq_id] = k

    @rule(seq_id=consumes(seqs))
    def complete(self, seq_id):
        """A request that runs to the end: everything covered is computed, then freed."""
        if seq_id in self.tokens:
            toks = self.tokens[seq_id]
            self._write(seq_id, min(len(toks), len(self.kv.block_table(seq_id)) * BLOCK_SIZE))
        self.finish(seq_id)

    @rule(seq_id=consumes(seqs))
    def finish(self, seq_id):
        self.kv.free(seq_id)
        self.tokens.pop(seq_id, None)
        self.computed.pop(seq_id, None)
        self.committed.pop(seq_id, None)
        assert self.kv.block_table(seq_id) == []

    @rule(seq_id=seqs)
    def preempt(self, seq_id):
        """Recompute preemption: free everything, then admit again from scratch."""
        if seq_id not in self.tokens:
            return
        toks = self.tokens.pop(seq_id)
        self.computed.pop(seq_id)
        self.committed.pop(seq_id)
        self.kv.free(seq_id)
        self._allocate_new(seq_id, toks, len(toks))

    @invariant()
    def allocator_invariants(self):
        self.kv.check_invariants()
        assert 0.0 <= self.kv.usage <= 1.0
        assert self.kv.num_used_blocks == len({b for s in self.tokens for b in self.kv.block_table(s)})

    def teardown(self):
        for seq_id in list(self.tokens):
            self.kv.free(seq_id)
        self.kv.check_invariants()
        assert self.kv.num_free_blocks == NUM_BLOCKS and self.kv.num_used_blocks == 0


AllocatorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
test_allocator_state_machine = AllocatorMachine.TestCase


@pytest.mark.parametrize("bad", [(0, 4), (4, 0)])
def test_rejects_empty_pool(bad):
    with pytest.raises(ValueError):
        KVAllocator(*bad)
