"""The router's pure routing logic (gateway/router_policy.py): affinity keys on the prefix
cache's own hash chain, consistent hashing with bounded load, load scores, round-robin."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from zinfer.actors import kv_allocator
from zinfer.gateway.router_policy import (
    ROOT_HASH, RoutePolicy, RoutingTable, affinity_chain, block_chain, ring_key, text_chain,
)


def table(kind: str = "prefix", n: int = 4, **kw: object) -> RoutingTable:
    t = RoutingTable(RoutePolicy(kind=kind, **kw))  # type: ignore[arg-type]
    for i in range(n):
        t.add(f"replica-{i}").up = True
    return t


def test_keys_follow_the_prefix_caches_block_hash_chain():
    ids = list(range(100, 180))  # 5 full blocks of 16
    parent, chain = kv_allocator._ROOT_HASH, []
    for i in range(5):
        parent = kv_allocator.block_hash(parent, ids[i * 16:(i + 1) * 16])
        chain.append(parent)
    assert ROOT_HASH == kv_allocator._ROOT_HASH
    assert block_chain(ids, 16, 10) == chain
    policy = RoutePolicy(prefix_blocks=2, chain_blocks=4)
    assert affinity_chain(ids, policy) == chain[:4]
    assert ring_key(affinity_chain(ids, policy), policy) == chain[1]
    assert ring_key(affinity_chain(ids[:20], policy), policy) == chain[0]  # only full blocks count
    assert affinity_chain(ids[:15], policy) == [] and ring_key([], policy) is None  # under one block: by load


def test_a_shared_prefix_goes_to_one_replica_and_different_ones_spread():
    t = table()
    system = list(range(1, 65))  # 4 full blocks shared by every conversation
    picks = {t.pick(affinity_chain(system + [500 + i] * 20, t.policy)) for i in range(50)}
    assert len(picks) == 1
    rng = random.Random(0)
    spread = Counter(t.pick(affinity_chain([rng.randrange(50000) for _ in range(64)], t.policy)) for _ in range(400))
    assert set(spread) == set(t.replicas) and min(spread.values()) > 40


def test_a_hot_prefix_spills_past_the_load_bound():
    t = table(load_bound=1.25)
    chain = affinity_chain(list(range(64)), t.policy)
    first = t.pick(chain)
    assert first is not None
    for _ in range(4):
        t.opened(first)
    second = t.pick(chain)
    assert second != first  # 4 open > 1.25 * (1 + 1)
    t.replicas[first].open = 0
    assert t.pick(chain) == first


def test_removing_a_replica_moves_only_its_keys():
    t = table(n=5)
    rng = random.Random(1)
    keys = [rng.getrandbits(64) for _ in range(300)]
    before = {k: t.pick([k]) for k in keys}
    t.remove("replica-2")
    after = {k: t.pick([k]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "replica-2" for k in moved)


def test_down_draining_and_excluded_replicas_are_never_picked():
    t = table(n=3)
    t.replicas["replica-0"].up = False
    t.replicas["replica-1"].draining = True
    for k in range(50):
        assert t.pick([k * 7919]) == "replica-2"
    assert t.pick([123], exclude=frozenset({"replica-2"})) is None
    assert table(n=0).pick([1]) is None


def test_load_policy_takes_the_lowest_score():
    t = table("load", n=3, w_open=1.0, w_waiting=1.0, w_kv=4.0)
    t.replicas["replica-0"].open = 2
    t.replicas["replica-1"].waiting = 1
    r2 = t.replicas["replica-2"]
    r2.kv_blocks, r2.kv_used_blocks = 100, 50  # score 2.0
    assert t.pick([]) == "replica-1"
    assert t.pick(affinity_chain(list(range(64)), t.policy)) == "replica-1"  # keys play no part


def test_prefix_policy_without_a_key_goes_by_load():
    t = table(n=2)
    t.replicas["replica-0"].open = 3
    assert t.pick([]) == "replica-1"


def test_round_robin_cycles_over_the_eligible_replicas():
    t = table("round_robin", n=3)
    picks = [t.pick([]) for _ in range(6)]
    assert Counter(picks) == {"replica-0": 2, "replica-1": 2, "replica-2": 2}
    assert picks[:3] != [picks[0]] * 3


def test_the_turns_of_a_conversation_follow_the_replica_that_holds_its_history():
    t = table(prefix_blocks=2)
    system = list(range(1, 33))  # 2 blocks every conversation shares: one ring key for all
    homes = {}
    for c in range(8):  # first turns: the shared key's replica, spilling past the load bound
        chain = affinity_chain(system + [1000 + c] * 16, t.policy)
        homes[c] = t.pick(chain)
        t.remember(chain, homes[c])
        t.opened(homes[c])
    assert len(set(homes.values())) > 1
    for c in range(8):  # later turns hold the first turn's blocks: they go where it went
        chain = affinity_chain(system + [1000 + c] * 16 + [2000 + c] * 32, t.policy)
        t.closed(homes[c])
        assert t.pick(chain) == homes[c]
        t.opened(homes[c])


def test_remembered_blocks_are_bounded():
    t = table(memory=10)
    t.remember(list(range(100)), "replica-0")
    assert len(t._sent) == 10 and 95 in t._sent and 5 not in t._sent


@pytest.mark.parametrize("bad", [dict(kind="random"), dict(prefix_blocks=0), dict(load_bound=0.5),
                                 dict(vnodes=0), dict(w_kv=-1.0), dict(block_size=0), dict(chain_blocks=0)])
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValueError):
        RoutingTable(RoutePolicy(**bad))  # type: ignore[arg-type]


def test_text_keys_share_hashes_as_prompts_share_their_first_bytes():
    one, two = b"a system prompt, then question one", b"a system prompt, then another"
    a, b = text_chain(one, 8, 8), text_chain(two, 8, 8)
    assert len(a) == len(one) // 8 and a[:2] == b[:2] and a[2] != b[2]  # "a system", " prompt,", then they part
    assert text_chain(one, 8, 2) == a[:2] and text_chain(one[:7], 8, 8) == []  # under one block: by load
    first = hashlib.blake2b(ROOT_HASH.to_bytes(8, "big") + one[:8], digest_size=8).digest()
    assert a[0] == int.from_bytes(first, "big")  # no per-process hash seed: a restarted router keys alike
    t = table()
    picks = {t.pick(text_chain(b"You are terse. " * 20 + f"question {i}".encode(), 64, 256)) for i in range(30)}
    assert len(picks) == 1
