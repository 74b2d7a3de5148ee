"""Which replica serves a request: prefix affinity on the KV block hash chain, consistent
hashing with bounded load, load scores from each replica's own counters, or round-robin.

A pure data structure (no I/O, no clock): gateway/router.py feeds its RoutingTable the replicas'
states and asks `pick` for each request. Its contracts:

- `pick` returns only a replica that is up and not draining, never one in `exclude`;
  None when there is none.
- "prefix": a request's prompt is read as a hash chain of its leading blocks, up to
  `chain_blocks` blocks. With `key` "text" (the default) a text prompt's blocks are
  `text_block` bytes of its UTF-8 (a chat's: its tools and messages as JSON), hashed with
  blake2b (the same in every process): no tokenizer on the routing path, and prompts that
  share their first bytes share their first hashes as they share their first KV blocks.
  With `key` "tokens", and for a prompt given as token ids, the blocks are its full KV
  blocks, chained exactly as the prefix cache chains them (actors/kv_allocator.py's
  block_hash from its root). The table remembers (`remember`, LRU, `memory`
  entries) which replica each block hash was last sent to: the replica that got the
  longest prefix of this chain holds those blocks in its cache, and takes the request
  while its open requests stay within `load_bound` times the mean (plus one); so the turns
  of one conversation stay together. A prefix never seen is keyed by the hash of its
  leading `prefix_blocks` blocks on a ring of `vnodes` points per replica: walking it
  clockwise from the key, the first replica within the bound takes it (consistent hashing
  with bounded loads, Mirrokni et al. 2018), so requests sharing a prefix share a first
  choice, and a hot prefix spills to the next replica instead of swamping one. A prompt
  shorter than one block goes by load.
- "load": the lowest score w_open * open + w_waiting * waiting + w_kv * KV usage (0..1),
  ties to the lower name.
- "round_robin": the next eligible replica in name order.

Replica names are stable across restarts, so a replica that returns keeps its ring points
(its cache is empty then, but the keys find it again).
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import msgspec

ROOT_HASH = 0x5A1F_C0DE
"""Parent hash of a sequence's first block: actors/kv_allocator.py's, so keys follow its chain."""

POLICIES = ("prefix", "load", "round_robin")
KEYS = ("text", "tokens")


class RoutePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the router picks a replica; validated at start-up (ValueError names the field)."""

    kind: str = "prefix"  # prefix | load | round_robin
    key: str = "text"  # prefix blocks of a text prompt: "text" (its bytes) or "tokens" (its KV blocks: tokenizes it)
    text_block: int = 64  # bytes per block of a text key (~16 tokens of English)
    prefix_blocks: int = 4  # leading full KV blocks hashed into a new prefix's ring key
    chain_blocks: int = 256  # full KV blocks of a prompt looked up and remembered
    memory: int = 200_000  # block hashes remembered (LRU) with the replica they were sent to
    block_size: int = 16  # tokens per KV block: the engine's (EngineConfig.block_size)
    load_bound: float = 1.25  # a replica takes a keyed request while open <= bound * (mean open + 1)
    vnodes: int = 64  # ring points per replica
    w_open: float = 1.0  # weight of the requests the router has open on a replica
    w_waiting: float = 1.0  # weight of the replica's own queue (its last stats)
    w_kv: float = 4.0  # weight of the replica's KV usage fraction (its last stats)

    def validate(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"route policy {self.kind!r}: one of {', '.join(POLICIES)}")
        if self.key not in KEYS:
            raise ValueError(f"route key {self.key!r}: one of {', '.join(KEYS)}")
        if not 1 <= self.text_block <= 65536:
            raise ValueError(f"text_block {self.text_block}: 1..65536")
        if not 1 <= self.prefix_blocks <= 1024:
            raise ValueError(f"prefix_blocks {self.prefix_blocks}: 1..1024")
        if not 1 <= self.chain_blocks <= 65536 or not 0 <= self.memory <= 100_000_000:
            raise ValueError(f"chain_blocks {self.chain_blocks} (1..65536) or memory {self.memory} (0..1e8)")
        if not 1 <= self.block_size <= 4096:
            raise ValueError(f"block_size {self.block_size}: 1..4096")
        if not 1.0 <= self.load_bound <= 100.0:
            raise ValueError(f"load_bound {self.load_bound}: 1.0..100.0")
        if not 1 <= self.vnodes <= 4096:
            raise ValueError(f"vnodes {self.vnodes}: 1..4096")
        for name in ("w_open", "w_waiting", "w_kv"):
            w = getattr(self, name)
            if not 0.0 <= w <= 1e6:
                raise ValueError(f"{name} {w}: 0..1e6")


@dataclass
class ReplicaState:
    """What the router knows of one replica: whether it takes requests, and its load."""

    name: str
    up: bool = False
    draining: bool = False
    open: int = 0  # requests the router has sent it and not seen end
    routed: int = 0  # requests the router has sent it in all
    waiting: int = 0  # its queue, as of its last stats
    running: int = 0
    kv_blocks: int = 0
    kv_used_blocks: int = 0

    @property
    def eligible(self) -> bool:
        return self.up and not self.draining

    def score(self, p: RoutePolicy) -> float:
        kv = self.kv_used_blocks / self.kv_blocks if self.kv_blocks else 0.0
        return p.w_open * self.open + p.w_waiting * self.waiting + p.w_kv * kv


def block_chain(token_ids: Sequence[int], block_size: int, limit: int) -> list[int]:
    """The prefix cache's hashes of the first `limit` full blocks of token_ids, in order."""
    out, parent = [], ROOT_HASH
    for i in range(min(limit, len(token_ids) // block_size)):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


def text_chain(data: bytes, block: int, limit: int) -> list[int]:
    """The hash chain of the first `limit` full blocks of `block` bytes of data, in order
    (64-bit blake2b of the parent's hash and the block: the same in every process)."""
    out, parent = [], ROOT_HASH.to_bytes(8, "big")
    for i in range(min(limit, len(data) // block)):
        parent = hashlib.blake2b(parent + data[i * block : (i + 1) * block], digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


def affinity_chain(token_ids: Sequence[int], policy: RoutePolicy) -> list[int]:
    """The chain a request is routed on: its first chain_blocks full blocks' hashes."""
    return block_chain(token_ids, policy.block_size, policy.chain_blocks)


def ring_key(chain: Sequence[int], policy: RoutePolicy) -> int | None:
    """The hash of the leading prefix_blocks full blocks (fewer if the prompt is shorter);
    None for a prompt under one block."""
    return chain[min(policy.prefix_blocks, len(chain)) - 1] if chain else None


def _point(text: str) -> int:
    """A ring position: 64 bits of sha1, the same in every process."""
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


@dataclass
class RoutingTable:
    """The replicas' states and the ring over their names; `pick` chooses, the caller
    counts (`opened`, `closed`) what it sends where."""

    policy: RoutePolicy
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    _ring: list[tuple[int, str]] = field(default_factory=list)
    _points: list[int] = field(default_factory=list)
    _next: int = 0
    _sent: OrderedDict[int, str] = field(default_factory=OrderedDict)  # block hash -> replica it went to (LRU)

    def __post_init__(self) -> None:
        self.policy.validate()

    def add(self, name: str) -> ReplicaState:
        """Know a replica (down until marked up); its ring points are placed now."""
        if name not in self.replicas:
            self.replicas[name] = ReplicaState(name)
            self._ring.extend((_point(f"{name}#{v}"), name) for v in range(self.policy.vnodes))
            self._ring.sort()
            self._points = [p for p, _ in self._ring]
        return self.replicas[name]

    def remove(self, name: str) -> None:
        """Forget a replica (scaled down) and its ring points."""
        self.replicas.pop(name, None)
        self._ring = [(p, n) for p, n in self._ring if n != name]
        self._points = [p for p, _ in self._ring]

    def opened(self, name: str) -> None:
        r = self.replicas[name]
        r.open += 1
        r.routed += 1

    def closed(self, name: str) -> None:
        r = self.replicas.get(name)
        if r is not None and r.open > 0:
            r.open -= 1

    def remember(self, chain: Sequence[int], name: str) -> None:
        """The request with this chain was sent to replica `name` (its blocks are cached there)."""
        if self.policy.kind != "prefix" or not self.policy.memory:
            return
        sent = self._sent
        for h in chain:
            sent[h] = name
            sent.move_to_end(h)
        while len(sent) > self.policy.memory:
            sent.popitem(last=False)

    def pick(self, chain: Sequence[int], exclude: frozenset[str] = frozenset()) -> str | None:
        """The replica for a request with this block hash chain (empty: a prompt under one
        block, or unknown); see the module docstring."""
        live = [r for r in self.replicas.values() if r.eligible and r.name not in exclude]
        if not live:
            return None
        kind = self.policy.kind
        if kind == "round_robin":
            live.sort(key=lambda r: r.name)
            self._next += 1
            return live[self._next % len(live)].name
        key = ring_key(chain, self.policy)
        if kind == "prefix" and key is not None:
            return self._cached_pick(chain, live) or self._ring_pick(key, live)
        return min(live, key=lambda r: (r.score(self.policy), r.name)).name

    def _cap(self, live: list[ReplicaState]) -> float:
        return self.policy.load_bound * (sum(r.open for r in live) / len(live) + 1.0)

    def _cached_pick(self, chain: Sequence[int], live: list[ReplicaState]) -> str | None:
        """The eligible replica within the load bound that got the longest prefix of chain."""
        if not self._sent:
            return None
        names, cap = {r.name: r for r in live}, self._cap(live)
        for h in reversed(chain):
            name = self._sent.get(h)
            if name is not None and name in names and names[name].open + 1 <= cap:
                return name
        return None

    def _ring_pick(self, key: int, live: list[ReplicaState]) -> str:
        names, cap = {r.name for r in live}, self._cap(live)
        start = bisect.bisect_left(self._points, key % (1 << 64))
        n = len(self._ring)
        seen: set[str] = set()
        for i in range(n):
            name = self._ring[(start + i) % n][1]
            if name in seen or name not in names:
                continue
            if self.replicas[name].open + 1 <= cap:
                return name
            seen.add(name)
            if len(seen) == len(names):
                break
        return min(live, key=lambda r: (r.score(self.policy), r.name)).name
