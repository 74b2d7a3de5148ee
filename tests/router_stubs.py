"""Stub replicas for the router's tests and benchmark: the engine's client protocol on a tcp
ROUTER socket, with a deterministic "model" so a stream continued elsewhere can be checked.

The model: the next token of a sequence is a pure function of every id before it, so a
replica that continues from prompt + tokens already sent produces what the lost replica
would have. Text comes from a real tokenizer's pieces (the router recomputes a moved
stream's text with the same tokenizer). `die_after` makes a stub close its socket (its
peers see the connection drop, as when an engine process dies) after sending that many
deltas in all. A request of n choices streams n sequences, choice i seeded as the engine
seeds it (seed + i), so a choice continued alone with that seed goes on as it would have.
"""

from __future__ import annotations

import msgspec
import trio
import zmq

from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import (
    Cancel,
    Cancelled,
    ClientEvent,
    ClientRequest,
    Delta,
    EngineStats,
    Finished,
    Generate,
    GetStats,
    Rejected,
    Started,
    TokenizeResult,
    Usage,
)
from zinfer.messages.codec import Codec
from zinfer.models.detokenize import IncrementalDetokenizer
from zinfer.models.prompt import PromptBuilder


def next_token(ids: list[int], vocab: int, seed: int = 0) -> int:
    """The stub model: a token from every id before it and the choice's seed (never 0, so
    never a special token here)."""
    h = 17 + seed % 1_000_003
    for t in ids[-8:]:
        h = (h * 31 + t) % 1_000_003
    return 3 + (h + len(ids)) % (vocab - 3)


def choice_seed(seed: int | None, index: int) -> int:
    """The seed choice index samples with, as the engine's front door seeds it (seed + index)."""
    return 0 if seed is None else seed if index == 0 else (seed + index) % 2**64


class StubReplica:
    """One stub replica. `async with trio.open_nursery() as n: await n.start(stub.run)`."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], prompts: PromptBuilder, delay_s: float = 0.0,
                 die_after: int | None = None, full: bool = False, stop_every: int | None = None):
        """full: refuse every generation with Rejected "queue_full". stop_every: a choice whose
        token id is a multiple of it ends there (finish reason "stop", as an EOS would)."""
        self.ctx, self.prompts, self.delay_s, self.die_after, self.full = ctx, prompts, delay_s, die_after, full
        self.stop_every = stop_every
        self.vocab = min(prompts.tokenizer.vocab_size, 200)
        self.sock = AsyncSocket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
        self.endpoint = self.sock.endpoint
        self.requests: Codec[ClientRequest] = Codec(ClientRequest)
        self.events: Codec[ClientEvent] = Codec(ClientEvent)
        self.seen: list[Generate] = []  # every Generate this stub got
        self.cancelled: set[str] = set()
        self.deltas = 0
        self.dead = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_dead, nursery.cancel_scope)
            task_status.started()
            try:
                while True:
                    peer, *frames = await self.sock.recv()
                    req = self.requests.decode(frames)
                    if isinstance(req, GetStats):
                        await self._send(bytes(peer), EngineStats(req.request_id, kv_blocks=100))
                    elif isinstance(req, Cancel):
                        self.cancelled.add(req.request_id)
                    elif isinstance(req, Generate):
                        self.seen.append(req)
                        if self.full:
                            await self._send(bytes(peer), Rejected(req.request_id, "queue_full", "the queue is full"))
                        else:
                            nursery.start_soon(self._generate, bytes(peer), req)
                    else:
                        await self._send(bytes(peer), TokenizeResult(req.request_id, [1, 2, 3]))
            except trio.ClosedResourceError:
                pass

    def kill(self) -> None:
        """Close the socket now: peers see the connection drop."""
        self.dead.set()

    async def _until_dead(self, scope: trio.CancelScope) -> None:
        await self.dead.wait()
        self.sock.close()
        scope.cancel()

    async def _send(self, peer: bytes, event: ClientEvent) -> None:
        await self.sock.send([peer, *self.events.encode(event)])

    async def _generate(self, peer: bytes, req: Generate) -> None:
        """Stream req's n choices, one Delta per unfinished choice per step."""
        messages = msgspec.to_builtins(req.messages) if req.messages is not None else None
        ids = self.prompts.prompt_ids(req.prompt, messages, req.prompt_ids, req.add_special)
        await self._send(peer, Started(req.request_id, len(ids)))
        n, limit = req.params.n, req.params.max_tokens
        detoks = [IncrementalDetokenizer(self.prompts.tokenizer) for _ in range(n)]
        outs = [list(ids) for _ in range(n)]
        reasons: list[str | None] = [None] * n
        for step in range(limit):
            for i in range(n):
                if reasons[i] is not None:
                    continue
                await trio.sleep(self.delay_s)
                if req.request_id in self.cancelled:
                    sent = sum(len(o) - len(ids) for o in outs)
                    await self._send(peer, Cancelled(req.request_id, Usage(len(ids), sent)))
                    return
                t = next_token(outs[i], self.vocab, choice_seed(req.params.seed, i))
                outs[i].append(t)
                if self.stop_every and t % self.stop_every == 0:
                    reasons[i] = "stop"
                elif step == limit - 1:
                    reasons[i] = "length"
                await self._send(peer, Delta(req.request_id, i, detoks[i].push(t), [t], finish_reason=reasons[i]))
                self.deltas += 1
                if self.die_after is not None and self.deltas >= self.die_after:
                    self.kill()
                    return
            if all(r is not None for r in reasons):
                break
        usage = Usage(len(ids), sum(len(o) - len(ids) for o in outs))
        await self._send(peer, Finished(req.request_id, [r or "length" for r in reasons], usage, ids))
