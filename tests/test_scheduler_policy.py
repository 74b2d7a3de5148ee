"""The scheduling policy alone: when a round needs the KV allocator and when it does not."""

from __future__ import annotations

from zinfer.actors.kv_actor import apply_update
from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.scheduler_policy import SchedulerConfig, SchedulerPolicy, Seq
from zinfer.messages.engine import KvUpdate
from zinfer.messages.params import SamplingParams


def _round(policy: SchedulerPolicy, alloc: KVAllocator) -> tuple[list, bool]:
    """Plan a round and grant it from `alloc` as the KV actor would; return (chunks, covered)."""
    chunks = policy.plan()
    covered = policy.kv_covered(chunks)
    grants = apply_update(alloc, KvUpdate(allocate=policy.kv_asks(chunks)))
    accepted, victims = policy.accept(chunks, grants)
    assert not victims
    policy.complete(accepted, {c.seq.seq_id: [7] for c in accepted})
    return accepted, covered


def test_kv_covered_exactly_when_the_allocator_would_change_nothing():
    policy = SchedulerPolicy(SchedulerConfig(block_size=4, num_blocks=16))
    alloc = KVAllocator(16, 4, prefix_caching=False)
    policy.add(Seq(1, [5, 6, 7], SamplingParams(max_tokens=20, ignore_eos=True), frozenset()))
    seen = []
    for _ in range(10):
        tables = {s.seq_id: list(alloc.block_table(s.seq_id)) for s in policy.running}
        accepted, covered = _round(policy, alloc)
        grew = any(alloc.block_table(c.seq.seq_id) != tables.get(c.seq.seq_id) for c in accepted)
        assert covered == (not grew)  # skipping the call is safe exactly when nothing would change
        seen.append(covered)
    # prefill of 3 (new), then decode steps ending at 4 | 5 (new block) 6 7 8 | 9 ...
    assert seen == [False, True, False, True, True, True, False, True, True, True]
