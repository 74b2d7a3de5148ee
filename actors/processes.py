"""Multi-process topologies: each actor but the front door in its own process.

The front door (actors/front_door_actor.py) stays in the parent, so when a child dies the parent
can still fail every open request: it watches each child, and on an unexpected exit
tells the front door (ActorFailed), then tears the engine down with EngineFailure.
Children exit on their own when the parent goes away, so no orphan outlives it.

Run one actor by hand (an executor on another host, say):
    python -m zinfer.actors.processes executor '<EngineConfig JSON>' '<Addresses JSON>' PARENT_PID
and write the engine's key pair on its stdin as one JSON line (`null` over ipc).

Over tcp every actor socket is authenticated: the parent makes an ephemeral CURVE key
pair per engine start and hands it to each child on stdin (never in argv, which other
users can read); every actor endpoint is bound as a CURVE server that lets in only
that key and connected to as a CURVE client with it (messages/curve.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

import msgspec
import structlog
import trio
import zmq

from zinfer.actors.engine_build import Engine, build_actor, engine_context
from zinfer.actors.engine_config import EngineConfig
from zinfer.actors.topology import Addresses
from zinfer.messages.channel import Outbox
from zinfer.messages.curve import CurveContext, KeyPair
from zinfer.messages.engine import ActorFailed, FrontDoorInbox
from zinfer.models.loader import open_model
from zinfer.traces.logs import configure_logging

log = structlog.get_logger("zinfer.processes")

CHILD_ACTORS = ("kv", "sampler", "executor", "scheduler")


class EngineFailure(RuntimeError):
    """An actor process died; the engine stopped."""


class _Actor(Protocol):
    """What a child process runs: an actor (engine_build.build_actor)."""

    async def run(self, task_status: trio.TaskStatus[None] = ...) -> None: ...


def child_command(name: str, config: EngineConfig, addrs: Addresses) -> list[str]:
    return [
        sys.executable, "-m", "zinfer.actors.processes", name,
        msgspec.json.encode(config).decode(), msgspec.json.encode(addrs).decode(), str(os.getpid()),
    ]


def actor_endpoints(addrs: Addresses) -> tuple[str, ...]:
    """Every endpoint of the topology: the ones CURVE secures over tcp."""
    return msgspec.structs.astuple(addrs)


async def _start_child(name: str, config: EngineConfig, addrs: Addresses, keys: KeyPair | None) -> trio.Process:
    """Start one actor process, give it the engine's keys on stdin, wait for its "ready" line."""
    cmd = child_command(name, config, addrs)
    proc = await trio.lowlevel.open_process(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None  # both opened as pipes
    async with proc.stdin:
        await proc.stdin.send_all(msgspec.json.encode(keys) + b"\n")
    buf = b""
    with trio.fail_after(300):
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some(256)
            if not chunk:
                raise EngineFailure(f"actor {name} exited during start-up (code {await proc.wait()})")
            buf += chunk
    return proc


@contextlib.asynccontextmanager
async def open_process_engine(config: EngineConfig, transport: str = "ipc") -> AsyncIterator[Engine]:
    """Start kv, sampler, executor and scheduler as processes; the front door here."""
    source = await trio.to_thread.run_sync(open_model, config.model)
    with tempfile.TemporaryDirectory(prefix="zinfer-") as tmp:
        if transport == "tcp":
            addrs = Addresses.tcp("127.0.0.1", _free_port_base(len(Addresses.__struct_fields__)))
        else:
            addrs = Addresses.ipc(tmp)
        keys = KeyPair.generate() if transport == "tcp" else None
        ctx = engine_context(config, keys, actor_endpoints(addrs))
        procs: dict[str, trio.Process] = {}
        try:
            for name in CHILD_ACTORS:
                procs[name] = await _start_child(name, config, addrs, keys)
            front_door = await trio.to_thread.run_sync(build_actor, "front_door", ctx, addrs, config, source)
            async with trio.open_nursery() as nursery:
                await nursery.start(front_door.run)
                for name, proc in procs.items():
                    nursery.start_soon(_watch, name, proc, ctx, addrs)
                yield Engine(ctx, addrs, source, {"front_door": front_door, "processes": procs}, config)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _stop_children(procs.values())
            ctx.destroy(linger=0)


async def _stop_children(procs: Iterable[trio.Process]) -> None:
    """SIGTERM (a child's tracer flushes), then SIGKILL whatever is left after 5 s."""
    live = [p for p in procs if p.returncode is None]
    for proc in live:
        proc.terminate()
    with trio.move_on_after(5):
        for proc in live:
            await proc.wait()
    for proc in live:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _watch(name: str, proc: trio.Process, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses) -> None:
    """Wait for a child's exit: an exit while the engine runs fails every open request."""
    code = await proc.wait()
    log.error("actor process exited", actor=name, pid=proc.pid, code=code)
    with trio.CancelScope(shield=True):  # even if the engine is closing right now
        out: Outbox[FrontDoorInbox] = Outbox(ctx, addrs.front_door, FrontDoorInbox)
        try:
            await out.send(ActorFailed(name, f"process {proc.pid} exited with code {code}"))
            await trio.sleep(0.2)  # let the front door send the failures before we tear down
        finally:
            out.close()
    raise EngineFailure(f"actor {name} (pid {proc.pid}) exited with code {code}")


def _free_port_base(n: int) -> int:
    """A run of n consecutive free TCP ports on 127.0.0.1 (best effort)."""
    for _ in range(50):
        # below Linux's ephemeral range (32768-60999): no outgoing connection takes one
        base = random.randint(20000, 32000)
        try:
            socks = []
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise EngineFailure("no free TCP port range for the topology")


# ---- the child side ------------------------------------------------------------------

async def _serve_child(actor: _Actor, parent_pid: int) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        print("ready", flush=True)
        nursery.start_soon(_exit_with_parent, parent_pid, nursery.cancel_scope)
        nursery.start_soon(_exit_on_sigterm, nursery.cancel_scope)


async def _exit_on_sigterm(scope: trio.CancelScope) -> None:
    """SIGTERM ends the actor through its finally blocks (sockets closed, traces flushed)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def _exit_with_parent(parent_pid: int, scope: trio.CancelScope) -> None:
    while os.getppid() == parent_pid:
        await trio.sleep(0.5)
    scope.cancel()


def child_main(argv: list[str]) -> None:
    name, config_json, addrs_json, parent = argv
    configure_logging("warning")
    config = msgspec.json.decode(config_json, type=EngineConfig)
    addrs = msgspec.json.decode(addrs_json, type=Addresses)
    keys = msgspec.json.decode(sys.stdin.buffer.readline(), type=KeyPair | None)
    ctx = CurveContext(actor_keys=keys, actor_endpoints=actor_endpoints(addrs))
    actor = build_actor(name, ctx, addrs, config, open_model(config.model))
    try:
        trio.run(_serve_child, actor, int(parent))
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    child_main(sys.argv[1:])
