"""The KV actor: owns the block allocator and answers the scheduler's updates.

It deals in block ids only; the executors own the memory. Request/reply over a
ROUTER: the scheduler is its one client and waits for each reply (one per round).
"""

from __future__ import annotations

import time

import trio
import zmq

from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.request_client import RequestClient
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.codec import Codec
from zinfer.messages.engine import KvGrant, KvInbox, KvReply, KvStats, KvUpdate, Shutdown
from zinfer.traces.setup import Tracing


class KvActor:
    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool = True,
        tracing: Tracing | None = None,
    ):
        self.allocator = KVAllocator(num_blocks, block_size, prefix_caching)
        self.tracing = tracing  # None: tracing off
        self.sock = AsyncSocket(ctx, zmq.ROUTER, bind=address)
        self.inbox: Codec[KvInbox] = Codec(KvInbox)
        self.outbox: Codec[KvReply] = Codec(KvReply)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                peer, *frames = await self.sock.recv()
                msg = self.inbox.decode(frames)
                if isinstance(msg, Shutdown):
                    return
                t0 = time.time_ns()
                reply = self.apply(msg)
                if self.tracing is not None and msg.traceparents:
                    self._trace(self.tracing, msg, reply, t0)
                await self.sock.send([peer, *self.outbox.encode(reply)])
        finally:
            self.sock.close()

    def apply(self, update: KvUpdate) -> KvReply:
        """Apply one update to the allocator (see apply_update); reply with its grants."""
        return KvReply(apply_update(self.allocator, update), self.stats())

    def _trace(self, tracing: Tracing, update: KvUpdate, reply: KvReply, t0: int) -> None:
        """One span per update, under the first request it serves and linked to the rest."""
        attrs = {
            "frees": len(update.free),
            "truncations": len(update.truncate),
            "commits": len(update.commit),
            "allocations": len(update.allocate),
            "granted": sum(g.ok for g in reply.grants),
            "kv.used_blocks": reply.stats.used_blocks,
            "kv.cached_blocks": reply.stats.cached_blocks,
        }
        parents = update.traceparents
        tracing.record("kv_update", parents[0], attrs, parents[1:], t0)

    def stats(self) -> KvStats:
        a = self.allocator
        return KvStats(a.num_blocks, a.num_used_blocks, a.num_cached_blocks)


def apply_update(allocator: KVAllocator, update: KvUpdate) -> list[KvGrant]:
    """Commits, then frees, then truncations, then the allocations in order; returns one grant per ask.

    Commits come first so that the last blocks of a sequence that finished (or was
    aborted) in the round they were written still enter the prefix cache.

    The protocol's invariant: blocks go only to sequences the scheduler admits, first
    come, first served. The scheduler lists its asks in plan order (running sequences,
    then the waiting queue's head onward) and this serves them in that order, each
    all-or-nothing, up to the first one that does not fit: that ask and every later one
    are refused and nothing is allocated for them. So the granted asks are a prefix of
    the list, and a refused sequence never holds blocks it was not admitted with.
    Mutates the allocator.
    """
    for c in update.commit:
        allocator.commit(c.seq_id, c.first_block, c.token_ids)
    for seq_id in update.free:
        allocator.free(seq_id)
    for t in update.truncate:
        allocator.truncate(t.seq_id, t.num_tokens)
    grants = []
    refused = False
    for ask in update.allocate:
        cached = None if refused else allocator.allocate(ask.seq_id, ask.token_ids, ask.num_tokens)
        if cached is None:
            refused = True
            grants.append(KvGrant(ask.seq_id, False))
        else:
            grants.append(KvGrant(ask.seq_id, True, allocator.block_table(ask.seq_id), cached))
    return grants


class KvClient(RequestClient[KvInbox, KvReply]):
    """The scheduler's end: one request in flight at a time."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str):
        super().__init__(ctx, address, KvInbox, KvReply)
