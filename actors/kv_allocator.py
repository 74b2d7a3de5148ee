"""The paged-KV block allocator: free list, reference counts, prefix cache, LRU eviction.

A pure data structure (no I/O). It deals in block ids only; executors own the memory
the ids index. The kv actor wraps it; the scheduler asks it for blocks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Sequence

# Parent hash of a sequence's first block. An int, not None: hashes of ints and tuples of
# ints are not randomised per process (unlike str), so block hashes are stable anywhere.
_ROOT_HASH = 0x5A1F_C0DE


def block_hash(parent_hash: int, block_tokens: Sequence[int]) -> int:
    """The prefix-cache key of one full block: a hash chain over (parent hash, its token ids)."""
    return hash((parent_hash, tuple(block_tokens)))


class KVAllocator:
    """Allocates fixed-size KV blocks to sequences, sharing full blocks of common prefixes.

    Each of the `num_blocks` blocks holds the KV of `block_size` consecutive tokens of one
    sequence. A sequence's block table lists its blocks in token order: token t lives in
    block_table[t // block_size].

    A full block whose KV has been written (`commit`) is registered in the prefix cache
    under block_hash(parent_hash, its tokens), chained from the first block, so a hash
    names the whole prefix up to and including that block. A new sequence whose prompt
    starts with the same full blocks takes those blocks (refcount + 1) instead of
    computing them again.

    Invariants (checked by `check_invariants`):
      - every block is in exactly one of: the free list (refcount 0, not registered), the
        evictable cache (refcount 0, registered) or in use (refcount >= 1);
      - a block's refcount equals the number of block tables holding it, and no table
        holds a block twice;
      - a registered hash maps to exactly one block and that block maps back to it;
      - taking a new block uses the free list first; when it is empty the least recently
        freed evictable block is evicted, which removes its hash from the cache;
      - no block is leaked or double-freed: free + evictable + in use == num_blocks.

    With prefix_caching=False nothing is ever registered and allocate reports 0 cached
    tokens.

    The allocator itself hands a block to whoever asks; the kv protocol around it (see
    actors/kv_actor.py apply_update) asks only for sequences the scheduler is admitting or
    running, in plan order, and stops at the first refusal.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks  # [num_blocks] tables holding each block
        self._free: deque[int] = deque(range(num_blocks))  # refcount 0, unregistered
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, registered; oldest first
        self._block_of_hash: dict[int, int] = {}
        self._hash_of_block: dict[int, int] = {}
        self._tables: dict[int, list[int]] = {}
        # per sequence: (number of leading blocks already hashed, hash of the last of them)
        self._hashed: dict[int, tuple[int, int]] = {}

    # ---- queries -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence could take now: the free list plus evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one block table."""
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, in use or evictable."""
        return len(self._hash_of_block)

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of seq_id's block table ([] for an unknown sequence)."""
        return list(self._tables.get(seq_id, ()))

    def num_blocks_needed(self, seq_id: int, num_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """How many blocks allocate(seq_id, ..., num_tokens) would take off num_free_blocks.

        allocate succeeds exactly when this is <= num_free_blocks. For a new sequence
        the prefix cache is consulted only if token_ids is given; without it the answer
        assumes no cache hit. Mutates nothing.
        """
        table = self._tables.get(seq_id)
        if table is not None:
            return max(0, self._blocks_for(num_tokens) - len(table))
        hits = self._lookup(token_ids) if token_ids is not None else []
        return self._drain(hits, num_tokens)

    # ---- mutations -----------------------------------------------------------------

    def allocate(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> int | None:
        """Ensure seq_id owns blocks covering its first num_tokens tokens.

        On the first call for seq_id, it first takes the longest cached prefix of full
        blocks matching token_ids, capped so that at least one token of token_ids is left
        to compute (cached tokens are whole blocks and < len(token_ids)); those blocks'
        refcounts go up, and they count as covered even beyond num_tokens. New blocks
        come from the free list, then by evicting the least recently freed cached block.

        Returns the number of prefix-cached tokens taken by this call (0 on later calls),
        or None, changing nothing, if not enough free blocks exist.
        """
        table = self._tables.get(seq_id)
        if table is not None:
            need = self._blocks_for(num_tokens) - len(table)
            if need > self.num_free_blocks:
                return None
            for _ in range(need):
                table.append(self._take_new_block())
            return 0

        hits = self._lookup(token_ids)
        if self._drain(hits, num_tokens) > self.num_free_blocks:
            return None
        table = []
        for block in hits:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            table.append(block)
        for _ in range(self._blocks_for(num_tokens) - len(table)):
            table.append(self._take_new_block())
        self._tables[seq_id] = table
        last_hash = self._hash_of_block[hits[-1]] if hits else _ROOT_HASH
        self._hashed[seq_id] = (len(hits), last_hash)
        return len(hits) * self.block_size

    def commit(self, seq_id: int, first_block: int, token_ids: Sequence[int]) -> None:
        """Record that blocks first_block, first_block + 1, ... of seq_id are full and hold KV.

        token_ids are the tokens of exactly those blocks (len(token_ids) // block_size of
        them), so a commit costs O(its blocks), not O(the sequence). Registers each block in
        the prefix cache, unless a block with the same hash is already registered (then this
        sequence's copy stays private and returns to the free list when freed). Blocks
        commit in order: blocks below the count committed so far (prefix-cache hits count
        as committed) are skipped; a gap or a block beyond the table raises ValueError.
        Unknown seq_id: no-op.
        """
        table = self._tables.get(seq_id)
        if table is None or not self.prefix_caching:
            return
        bs = self.block_size
        end = first_block + len(token_ids) // bs
        done, parent = self._hashed[seq_id]
        if first_block > done or end > len(table):
            raise ValueError(
                f"seq {seq_id}: commit of blocks {first_block}..{end - 1} with {done} committed of {len(table)}")
        for i in range(done, end):
            j = i - first_block
            h = block_hash(parent, token_ids[j * bs : (j + 1) * bs])
            block = table[i]
            if h not in self._block_of_hash:
                self._block_of_hash[h] = block
                self._hash_of_block[block] = h
            parent = h
        if end > done:
            self._hashed[seq_id] = (end, parent)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shrink seq_id's table to the blocks covering its first num_tokens tokens (speculative
        tokens past them were rejected): the blocks after go back, as free() returns them. Blocks
        still hashed as committed stay (a commit never covers tokens past the KV that was kept).
        Unknown seq_id: no-op."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        keep = max(self._blocks_for(num_tokens), self._hashed[seq_id][0])
        self._release(table[keep:])
        del table[keep:]

    def free(self, seq_id: int) -> None:
        """Drop seq_id and its references to its blocks. Unknown seq_id: no-op.

        A block whose refcount reaches 0 becomes evictable if registered (keeping its KV
        for future prefix hits), else returns to the free list. Blocks are released tail
        first, so a sequence's last blocks are evicted before its shared-prefix blocks.
        """
        table = self._tables.pop(seq_id, None)
        self._hashed.pop(seq_id, None)
        if table is None:
            return
        self._release(table)

    # ---- internals -----------------------------------------------------------------

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference to each block, last first; a block left unreferenced becomes
        evictable if registered (its KV kept for prefix hits), else free."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of_block:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _lookup(self, token_ids: Sequence[int]) -> list[int]:
        """Blocks of the longest cached full-block prefix of token_ids, leaving >= 1 token."""
        if not self.prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent = _ROOT_HASH
        for i in range((len(token_ids) - 1) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self._block_of_hash.get(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def _drain(self, hits: list[int], num_tokens: int) -> int:
        """Blocks a first allocate with these cache hits takes off num_free_blocks."""
        evictable_hits = sum(1 for b in hits if self._refs[b] == 0)
        return evictable_hits + max(0, self._blocks_for(num_tokens) - len(hits))

    def _take_new_block(self) -> int:
        """Pop a block from the free list, else evict the oldest cached one; refcount 1."""
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of_hash[self._hash_of_block.pop(block)]
        self._refs[block] = 1
        return block

    def check_invariants(self) -> None:
        """Raise AssertionError describing the first violated invariant. Mutates nothing."""
        n = self.num_blocks
        free = list(self._free)
        assert len(set(free)) == len(free), f"free list holds duplicates: {free}"
        counts = [0] * n
        for seq_id, table in self._tables.items():
            assert len(set(table)) == len(table), f"seq {seq_id} holds a block twice: {table}"
            for b in table:
                assert 0 <= b < n, f"seq {seq_id} holds out-of-range block {b}"
                counts[b] += 1
        assert counts == self._refs, f"refcounts {self._refs} != table counts {counts}"
        for b in free:
            assert self._refs[b] == 0, f"free block {b} has refcount {self._refs[b]}"
            assert b not in self._hash_of_block, f"free block {b} is registered"
        for b in self._evictable:
            assert self._refs[b] == 0, f"evictable block {b} has refcount {self._refs[b]}"
            assert b in self._hash_of_block, f"evictable block {b} is not registered"
        in_use = sum(1 for r in self._refs if r > 0)
        assert len(free) + len(self._evictable) + in_use == n, (
            f"leak or double free: free {len(free)} + evictable {len(self._evictable)} "
            f"+ in use {in_use} != {n}"
        )
        assert set(free).isdisjoint(self._evictable), "a block is both free and evictable"
        assert len(self._block_of_hash) == len(self._hash_of_block), "hash maps differ in size"
        for h, b in self._block_of_hash.items():
            assert self._hash_of_block.get(b) == h, f"hash {h} -> block {b} does not map back"
        if not self.prefix_caching:
            assert not self._block_of_hash, "prefix caching is off but blocks are registered"
        for seq_id, (done, _) in self._hashed.items():
            assert seq_id in self._tables, f"hash progress kept for freed seq {seq_id}"
            assert done <= len(self._tables[seq_id]), f"seq {seq_id} hashed past its table"
        assert self._hashed.keys() == self._tables.keys(), "hash progress and tables disagree"
