"""The router's hold on its replicas: where they are (a ReplicaSource), one supervisor task
per replica that keeps an AsyncClient to its front door while it answers, and the replica's
state in the routing table (up or down, its load from its own stats).

Each supervisor asks the source for the replica's endpoint (waiting while it starts or
restarts), connects with ZeroMQ heartbeats and a socket monitor, marks the replica up when
its front door answers, polls its stats every `poll_s`, and marks it down the moment its
connection drops (a killed process closes its sockets; a host that vanishes misses three
heartbeats) or its stats go unanswered for `stall_s`; then it asks the source again.
Marking down comes before the client closes, so the streams it fails read as a loss
(`Link.incarnation` moved on), not as the replica's own failure.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Protocol

import structlog
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from zinfer.gateway.client import AsyncClient, EngineError
from zinfer.gateway.router_policy import ReplicaState, RoutingTable
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import EngineStats
from zinfer.messages.curve import ClientKeys

log = structlog.get_logger("zinfer.router")


class ReplicaGone(Exception):
    """The source will not bring this replica back (scaled down, or out of restarts)."""


class ReplicaSource(Protocol):
    """Where replicas are: their names, and each one's front door once it is up."""

    def names(self) -> list[str]: ...

    async def locate(self, name: str) -> str:
        """The replica's front-door endpoint once it is up (waits while it starts or
        restarts); ReplicaGone when it will not come back."""
        ...

    async def stop(self, name: str) -> None:
        """Stop the replica for good (after a drain)."""
        ...


@dataclass
class Link:
    """The router's hold on one replica: its client while up, and its incarnation (bumped
    each time it goes up or down, so a stream knows whether its replica was lost)."""

    name: str
    client: AsyncClient | None = None
    incarnation: int = 0
    stats: EngineStats | None = None
    lost: trio.Event = field(default_factory=trio.Event)  # set when this incarnation is marked down
    stop: trio.Event = field(default_factory=trio.Event)  # set by drain: supervision ends


class ReplicaLinks:
    """The links to a source's replicas and their supervisors. `run` supervises until cancelled."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], source: ReplicaSource, table: RoutingTable,
                 curve: ClientKeys | None, heartbeat_s: float, poll_s: float, stall_s: float):
        self.ctx, self.source, self.table, self.curve = ctx, source, table, curve
        self.heartbeat_s, self.poll_s, self.stall_s = heartbeat_s, poll_s, stall_s
        self.links: dict[str, Link] = {}
        self.changed = trio.Event()  # set (and replaced) whenever a replica goes up
        for name in source.names():
            table.add(name)
            self.links[name] = Link(name)

    @property
    def up(self) -> list[str]:
        """The names of the replicas taking requests now."""
        return [n for n, r in self.table.replicas.items() if r.eligible]

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for link in self.links.values():
                nursery.start_soon(self._supervise, link)

    def _notify(self) -> None:
        """Wake every waiter of `changed` (a replica went up)."""
        self.changed.set()
        self.changed = trio.Event()

    def mark_down(self, link: Link) -> None:
        """Take the replica out of routing now; its client's open streams then end with Failed,
        which the router reads as a loss (the incarnation moved on)."""
        if link.client is None:
            return
        link.client = None
        link.incarnation += 1
        link.lost.set()
        self.table.replicas[link.name].up = False
        log.warning("replica down", replica=link.name)

    async def _supervise(self, link: Link) -> None:
        """Keep the link to one replica: find it, hold it while it answers, find it again."""
        state = self.table.replicas[link.name]
        while not link.stop.is_set():
            try:
                endpoint = await self.source.locate(link.name)
            except ReplicaGone:
                log.warning("replica gone", replica=link.name)
                return
            try:
                await self._hold(link, state, endpoint)
            except (EngineError, zmq.ZMQError, trio.ClosedResourceError) as exc:
                log.warning("replica link failed", replica=link.name, error=str(exc))
            self.mark_down(link)
            await trio.sleep(0.05)

    async def _hold(self, link: Link, state: ReplicaState, endpoint: str) -> None:
        """Serve through one incarnation of the replica until its connection is lost."""
        monitor_addr = f"inproc://zinfer-router-monitor-{uuid.uuid4().hex[:12]}"
        async with AsyncClient(self.ctx, endpoint, self.curve, heartbeat_s=self.heartbeat_s) as client:
            client.sock.socket.monitor(monitor_addr, zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
            monitor = AsyncSocket(self.ctx, zmq.PAIR, connect=monitor_addr)
            try:
                with trio.move_on_after(max(10.0, 10 * self.heartbeat_s)) as scope:
                    stats = await client.stats()
                if scope.cancelled_caught:
                    return
                link.stats = stats
                link.client, link.lost = client, trio.Event()
                link.incarnation += 1
                state.up = True
                self._apply(state, stats)
                log.warning("replica up", replica=link.name, endpoint=endpoint, incarnation=link.incarnation)
                self._notify()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._poll, link, client, state)
                    nursery.start_soon(self._until_lost, link, monitor)
                    await link.lost.wait()
                    nursery.cancel_scope.cancel()
            finally:
                self.mark_down(link)  # before the client closes: its streams' Failed read as a loss
                with contextlib.suppress(zmq.ZMQError):
                    client.sock.socket.disable_monitor()
                monitor.close()

    async def _until_lost(self, link: Link, monitor: AsyncSocket) -> None:
        while True:
            frames = await monitor.recv()
            event = parse_monitor_message([bytes(f) for f in frames])
            if event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self.mark_down(link)
                return

    async def _poll(self, link: Link, client: AsyncClient, state: ReplicaState) -> None:
        """Read the replica's stats every poll_s; one that answers none for stall_s is lost
        (a backstop: a dead peer's connection normally ends first)."""
        last = trio.current_time()
        while True:
            await trio.sleep(self.poll_s)
            with trio.move_on_after(max(1.0, 4 * self.poll_s)):
                link.stats = stats = await client.stats()
                self._apply(state, stats)
                last = trio.current_time()
            if trio.current_time() - last > self.stall_s:
                log.warning("replica stalled", replica=link.name, seconds=round(trio.current_time() - last, 1))
                self.mark_down(link)
                return

    @staticmethod
    def _apply(state: ReplicaState, s: EngineStats) -> None:
        state.waiting, state.running, state.kv_blocks, state.kv_used_blocks = \
            s.waiting, s.running, s.kv_blocks, s.kv_used_blocks


class StaticReplicas:
    """Replicas at fixed endpoints (replicas started by other means, and tests): locate
    returns the endpoint at once; stop forgets it."""

    def __init__(self, endpoints: dict[str, str]):
        self.endpoints = dict(endpoints)

    def names(self) -> list[str]:
        return list(self.endpoints)

    async def locate(self, name: str) -> str:
        if name not in self.endpoints:
            raise ReplicaGone(name)
        return self.endpoints[name]

    async def stop(self, name: str) -> None:
        self.endpoints.pop(name, None)
