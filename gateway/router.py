"""The router: one engine client in front of many replicas, for every transport.

`Router` answers what `AsyncClient` answers (generate, cancel, tokenize, detokenize, stats),
so the HTTP, websocket, ZeroMQ and stdio gateways take it in the client's place. Behind it,
gateway/router_links.py keeps a link to each replica of a `ReplicaSource` (Ray in
gateway/replicas.py, fixed endpoints in tests) and its state in the routing table
(gateway/router_policy.py), which picks the replica of each request; a replica that dies
is marked down within a few `heartbeat_s`, busy or not, and up again once Ray has
restarted it and its front door answers.

Contracts:
- A request goes to the replica the policy picks; while no replica is up it waits up to
  `wait_s` for one, then ends with Failed code "no_replica". A replica whose queue is full
  (Rejected "queue_full") passes it to the next replica that has not refused it; the last
  refusal reaches the client. Every request ends with exactly one terminal event.
- A request whose replica is lost moves to another (gateway/router_stream.py: resent when
  nothing was streamed, continued from prompt + tokens sent otherwise; a request of several
  choices splits into one continuation per unfinished choice, each routed on its own and
  merged back into its stream), at most `max_moves` times. A Failed event that the replica
  itself sends (an actor in it failed) is passed on, not retried: a request that breaks an
  engine is not handed to the next one.
- `drain(name)` stops new requests to a replica, waits for its requests to finish up to a
  timeout, then hands the rest over (they move as if it were lost) and stops it.
- With tracing, each request gets a "router" span (replica, moves) that is the parent of
  the replica's request span: the traceparent goes over the ZeroMQ protocol.
"""

from __future__ import annotations

import uuid
from contextlib import aclosing
from types import TracebackType
from typing import AsyncGenerator, Sequence

import msgspec
import structlog
import trio
import zmq
from opentelemetry.trace import Span

from zinfer.gateway.client import AsyncClient, EngineError, MessageIn, ToolIn, _as_messages, _as_tools
from zinfer.gateway.router_links import Link, ReplicaLinks, ReplicaSource
from zinfer.gateway.router_keys import request_chain
from zinfer.gateway.router_policy import RoutePolicy, RoutingTable
from zinfer.gateway.router_stream import RoutedStream, Split
from zinfer.messages.client import ClientEvent, EngineStats, Failed, Generate, Rejected
from zinfer.messages.curve import ClientKeys
from zinfer.messages.params import SamplingParams
from zinfer.models.prompt import PromptBuilder
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.router")

NO_REPLICA = "no_replica"
"""Failed.code when no replica is left to serve a request."""


class RouterOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The router's timings and limits; validated at start-up."""

    policy: RoutePolicy = RoutePolicy()
    poll_s: float = 0.25  # how often each replica's stats are read
    heartbeat_s: float = 1.0  # ZeroMQ heartbeat interval; a silent peer is lost after 3 of them
    wait_s: float = 60.0  # how long a request waits for a replica while none is up
    max_moves: int = 16  # replicas a request may lose before it fails
    drain_s: float = 30.0  # how long a drain waits for a replica's requests before handing them over
    stall_s: float = 30.0  # a replica whose stats go unanswered this long is lost

    def validate(self) -> None:
        self.policy.validate()
        for name, lo, hi in (("poll_s", 0.01, 60.0), ("heartbeat_s", 0.05, 60.0), ("wait_s", 0.0, 3600.0),
                             ("drain_s", 0.0, 3600.0), ("stall_s", 1.0, 3600.0)):
            if not lo <= getattr(self, name) <= hi:
                raise ValueError(f"{name} {getattr(self, name)}: {lo}..{hi}")
        if not 0 <= self.max_moves <= 1000:
            raise ValueError(f"max_moves {self.max_moves}: 0..1000")


class Router:
    """Routes requests over the replicas of a source. `async with Router(...) as router`."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], source: ReplicaSource,
                 options: RouterOptions | None = None,
                 prompts: PromptBuilder | None = None, curve: ClientKeys | None = None, tracing: Tracing | None = None):
        """options: RouterOptions() when None. prompts: the model's tokenizer and template, for
        affinity keys and continuations (None: requests go by load, and a stream that loses its
        replica after tokens fails)."""
        options = options or RouterOptions()
        options.validate()
        self.source, self.options, self.prompts, self.tracing = source, options, prompts, tracing
        self.table = RoutingTable(options.policy)
        self.replicas = ReplicaLinks(ctx, source, self.table, curve, options.heartbeat_s, options.poll_s,
                                     options.stall_s)
        self.links = self.replicas.links
        self.where: dict[str, Link] = {}  # request id -> the link serving it now
        self.streams: dict[str, RoutedStream] = {}  # request id -> its stream, from arrival to its end

    async def __aenter__(self) -> "Router":
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self.replicas.run)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        self._nursery.cancel_scope.cancel()
        return await self._nursery_cm.__aexit__(exc_type, exc, tb)

    # ---------------------------------------------------------------- the engine client's face

    @property
    def up(self) -> list[str]:
        """The names of the replicas taking requests now."""
        return self.replicas.up

    async def wait_up(self, count: int = 1) -> None:
        """Return once at least count replicas are up."""
        while len(self.up) < count:
            await self.replicas.changed.wait()

    async def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        prompt_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        traceparent: str | None = None,
        tools: Sequence[ToolIn] | None = None,
    ) -> AsyncGenerator[ClientEvent, None]:
        """Stream one request's events from the replicas that serve it, ending with exactly one
        terminal event. Leaving the loop early cancels the request on its replica."""
        req = Generate(request_id or uuid.uuid4().hex, prompt, _as_messages(messages), prompt_ids,
                       params or SamplingParams(), add_special, traceparent, _as_tools(tools))
        stream = RoutedStream(req, self.prompts.tokenizer if self.prompts is not None else None)
        chain = request_chain(req, self.options.policy, self.prompts)
        span = self.tracing.start("router", traceparent, {"request_id": req.request_id}) if self.tracing else None
        try:
            async with aclosing(self._route(stream, chain, span, set())) as events:
                async for event in events:
                    yield event
        finally:
            if span is not None:
                span.set_attribute("moves", stream.moves)
                span.end()

    async def _route(self, stream: RoutedStream, chain: list[int], span: Span | None,
                     lost: set[str]) -> AsyncGenerator[ClientEvent, None]:
        """One stream's events from the replicas that serve it in turn (lost: the replicas it
        has lost), ending with exactly one terminal event."""
        req = stream.original
        full: set[str] = set()  # replicas that refused it with a full queue
        self.streams.setdefault(req.request_id, stream)
        try:
            while not stream.done:
                if stream.cancelled:  # cancelled while it moved between replicas
                    yield stream.cancel()
                    return
                link = await self._choose(chain, frozenset(lost | full))
                if link is None or stream.moves > self.options.max_moves:
                    why = "no replica is up" if link is None else f"it lost {stream.moves} replicas"
                    yield Failed(req.request_id, f"no replica is left to serve the request ({why})", NO_REPLICA)
                    return
                if stream.needs_prompt_ids() and self.prompts is not None:
                    stream.prompt_ids = await self._prompt_ids(req)
                wire = stream.request()
                if isinstance(wire, Split):
                    log.warning("request split", request_id=req.request_id, choices=sorted(wire.children))
                    async with aclosing(self._split(stream, wire, chain, span, lost)) as events:
                        async for event in events:
                            yield event
                    return
                if isinstance(wire, list):
                    for event in wire:
                        yield event
                    return
                if span is not None:
                    span.set_attribute("replica", link.name)
                    wire = msgspec.structs.replace(wire, traceparent=Tracing.traceparent(span))
                async for event in self._on(link, wire, stream, full):
                    yield event
                if link.name in full:  # its queue was full: another replica may take it
                    continue
                if not stream.done:  # its replica was lost
                    stream.moves += 1
                    lost.add(link.name)
                    if len(lost) >= len(self.links):
                        lost.clear()  # every replica failed it once: any that returns may take it
                    log.warning("request moved", request_id=req.request_id, lost=link.name,
                                tokens_sent=sum(len(ids) for ids in stream.ids))
        finally:
            if self.streams.get(req.request_id) is stream:
                del self.streams[req.request_id]

    async def _split(self, stream: RoutedStream, split: Split, chain: list[int], span: Span | None,
                     lost: set[str]) -> AsyncGenerator[ClientEvent, None]:
        """A stream of several choices, each unfinished one routed on its own as a child
        (in the router's nursery), their events merged back into the one stream."""
        send, receive = trio.open_memory_channel[tuple[int, ClientEvent]](float("inf"))
        scope: trio.CancelScope = await self._nursery.start(self._run_children, split, chain, span, lost, send)
        try:
            async with receive:
                async for index, event in receive:
                    for out in stream.merge(index, event):
                        yield out
                    if stream.done:
                        return
            if not stream.done:  # the router closed under them
                yield stream.merge(0, Failed(stream.request_id, "the router stopped", NO_REPLICA))[0]
        finally:
            scope.cancel()

    async def _run_children(self, split: Split, chain: list[int], span: Span | None, lost: set[str],
                            send: trio.MemorySendChannel[tuple[int, ClientEvent]],
                            task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        async with send, trio.open_nursery() as nursery:
            task_status.started(nursery.cancel_scope)
            for index, child in split.children.items():
                nursery.start_soon(self._run_child, index, child, chain, span, set(lost), send.clone())

    async def _run_child(self, index: int, child: RoutedStream, chain: list[int], span: Span | None,
                         lost: set[str], send: trio.MemorySendChannel[tuple[int, ClientEvent]]) -> None:
        async with send, aclosing(self._route(child, chain, span, lost)) as events:
            async for event in events:
                try:
                    send.send_nowait((index, event))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

    async def _on(self, link: Link, wire: Generate, stream: RoutedStream,
                  full: set[str]) -> AsyncGenerator[ClientEvent, None]:
        """The client's events from one replica's stream; returns without `stream.done` when
        the replica was lost under it, or (adding its name to full) when its queue was full
        and another eligible replica has not refused the request yet."""
        client, incarnation = link.client, link.incarnation
        if client is None:  # lost while the request waited for its prompt ids
            return
        self.where[wire.request_id] = link
        self.table.opened(link.name)
        try:
            async with aclosing(client.generate(
                    wire.prompt, messages=wire.messages, prompt_ids=wire.prompt_ids, params=wire.params,
                    request_id=wire.request_id, add_special=wire.add_special, traceparent=wire.traceparent,
                    tools=wire.tools)) as events:
                asked = False
                async for event in events:
                    if stream.cancelled and not asked:  # cancelled before this replica had it
                        asked = True
                        client.cancel(wire.request_id)
                    if isinstance(event, Failed) and link.incarnation != incarnation:
                        return  # the link closed under it: not the replica's failure
                    if isinstance(event, Rejected) and event.code == "queue_full" and \
                            set(self.up) - full - {link.name}:
                        full.add(link.name)
                        return
                    for out in stream.see(event):
                        yield out
                    if stream.done:
                        return
        finally:
            self.table.closed(link.name)
            if self.where.get(wire.request_id) is link:
                del self.where[wire.request_id]

    def cancel(self, request_id: str) -> None:
        """Cancel a request on the replica serving it (its stream then ends with Cancelled);
        an unknown id is ignored."""
        stream = self.streams.get(request_id)
        if stream is not None and stream.children:  # split: each choice's child is cancelled
            for child in list(stream.children.values()):
                child.cancelled = True  # a child not yet routed ends as it starts
                self.cancel(child.request_id)
            return
        link = self.where.get(request_id)
        if link is not None and link.client is not None:
            link.client.cancel(request_id)
        elif stream is not None:
            stream.cancelled = True

    async def tokenize(self, text: str | None = None, *, messages: Sequence[MessageIn] | None = None,
                       add_special: bool = True, tools: Sequence[ToolIn] | None = None) -> list[int]:
        return await (await self._any()).tokenize(text, messages=messages, add_special=add_special, tools=tools)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await (await self._any()).detokenize(token_ids)

    async def stats(self) -> EngineStats:
        """Every up replica's last stats, summed (open_requests: the router's open requests)."""
        total = EngineStats()
        for link in self.links.values():
            s = link.stats
            if s is None or link.client is None:
                continue
            total.running += s.running
            total.waiting += s.waiting
            total.kv_blocks += s.kv_blocks
            total.kv_used_blocks += s.kv_used_blocks
            total.kv_cached_blocks += s.kv_cached_blocks
            total.rounds += s.rounds
            total.open_requests += s.open_requests
        return total

    def replica_stats(self) -> dict[str, tuple[EngineStats | None, int]]:
        """By replica name: its last stats (None while it is down) and the requests routed to it."""
        return {n: (link.stats if link.client is not None else None, self.table.replicas[n].routed)
                for n, link in self.links.items()}

    async def drain(self, name: str, timeout_s: float | None = None) -> None:
        """Take no more requests on the replica, let its requests finish (up to timeout_s,
        default drain_s), hand the rest over to other replicas, then stop it."""
        link, state = self.links[name], self.table.replicas[name]
        state.draining = True
        with trio.move_on_after(self.options.drain_s if timeout_s is None else timeout_s):
            while state.open:
                await trio.sleep(0.05)
        link.stop.set()
        self.replicas.mark_down(link)
        with trio.CancelScope(shield=True):
            await self.source.stop(name)

    async def drain_all(self, timeout_s: float | None = None) -> None:
        """Drain every replica at once (shutdown): no request is handed over, as none is left."""
        async with trio.open_nursery() as nursery:
            for name in list(self.links):
                nursery.start_soon(self.drain, name, timeout_s)

    # ---------------------------------------------------------------- internals

    async def _prompt_ids(self, req: Generate) -> list[int] | None:
        """The whole prompt's ids as the replicas encode them (None if it cannot be encoded)."""
        assert self.prompts is not None
        prompts = self.prompts

        def encode() -> list[int]:
            if req.messages is not None:
                return prompts.tokenize(None, msgspec.to_builtins(req.messages), True, msgspec.to_builtins(req.tools))
            return prompts.prompt_ids(req.prompt, None, None, req.add_special)

        try:
            return await trio.to_thread.run_sync(encode)
        except (ValueError, TypeError, KeyError):
            return None

    async def _choose(self, chain: list[int], exclude: frozenset[str]) -> Link | None:
        """The link to send to (remembered as holding chain's blocks); waits up to wait_s
        while none is eligible."""
        with trio.move_on_after(self.options.wait_s):
            while True:
                name = self.table.pick(chain, exclude) or self.table.pick(chain)
                if name is not None and self.links[name].client is not None:
                    self.table.remember(chain, name)
                    return self.links[name]
                await self.replicas.changed.wait()
        return None

    async def _any(self) -> AsyncClient:
        link = await self._choose([], frozenset())
        if link is None or link.client is None:
            raise EngineError("no replica is up")
        return link.client

