"""Stub replicas for the router's tests and benchmark: the engine's client protocol on a tcp
ROUTER socket, with a deterministic "model" so a stream continued elsewhere can be checked.

The model: the next token of a sequence is a pure function of every id before it, so a
replica that continues from prompt + tokens already sent produces what the lost replica
would have. Text comes from a real tokenizer's pieces (the router recomputes a moved
stream's text with the same tokenizer). `die_after` makes a stub close its socket (its
peers see the connection drop, as when an engine process dies) after sending that many
deltas in all.
"""

from __future__ import annotations

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


def next_token(ids: list[int], vocab: int) -> int:
    """The stub model: a token from every id before it (never 0, so never a special token here)."""
    h = 17
    for t in ids[-8:]:
        h = (h * 31 + t) % 1_000_003
    return 3 + (h + len(ids)) % (vocab - 3)


class StubReplica:
    """One stub replica. `async with trio.open_nursery() as n: await n.start(stub.run)`."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], prompts: PromptBuilder, delay_s: float = 0.0,
                 die_after: int | None = None, full: bool = False):
        """full: refuse every generation with Rejected "queue_full"."""
        self.ctx, self.prompts, self.delay_s, self.die_after, self.full = ctx, prompts, delay_s, die_after, full
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
        ids = self.prompts.prompt_ids(req.prompt, None, req.prompt_ids, req.add_special)
        await self._send(peer, Started(req.request_id, len(ids)))
        detok, out = IncrementalDetokenizer(self.prompts.tokenizer), list(ids)
        n = req.params.max_tokens
        for i in range(n):
            if self.delay_s:
                await trio.sleep(self.delay_s)
            else:
                await trio.sleep(0)
            if req.request_id in self.cancelled:
                await self._send(peer, Cancelled(req.request_id, Usage(len(ids), i)))
                return
            t = next_token(out, self.vocab)
            out.append(t)
            last = i == n - 1
            await self._send(peer, Delta(req.request_id, 0, detok.push(t), [t],
                                         finish_reason="length" if last else None))
            self.deltas += 1
            if self.die_after is not None and self.deltas >= self.die_after:
                self.kill()
                return
        await self._send(peer, Finished(req.request_id, ["length"], Usage(len(ids), n), ids))
