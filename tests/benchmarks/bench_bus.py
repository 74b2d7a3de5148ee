"""Bus round-trip latency: µs for a 32-byte one-frame message to go to a PAIR socket's
echo task and back, over inproc, ipc and tcp, in one trio process. Prints numbers;
asserts nothing.

    python tests/benchmarks/bench_bus.py [--n 3000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid

import trio
import zmq

from zinfer.messages.bus import AsyncSocket


def address(transport: str, ipc_dir: str) -> str:
    if transport == "inproc":
        return f"inproc://{uuid.uuid4().hex}"
    if transport == "ipc":
        return f"ipc://{ipc_dir}/{uuid.uuid4().hex[:8]}"
    return "tcp://127.0.0.1:*"


async def round_trip_us(ctx: zmq.Context, transport: str, ipc_dir: str, n: int) -> float:
    """Mean µs of one send + echoed recv over n messages, after 200 warm-up ones."""
    a = AsyncSocket(ctx, zmq.PAIR, bind=address(transport, ipc_dir))
    b = AsyncSocket(ctx, zmq.PAIR, connect=a.endpoint)

    async def echo() -> None:
        while True:
            await b.send(await b.recv())

    async with a, b:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            for _ in range(200):
                await a.send([b"warm"])
                await a.recv()
            t = time.perf_counter()
            for _ in range(n):
                await a.send([b"x" * 32])
                await a.recv()
            elapsed = time.perf_counter() - t
            nursery.cancel_scope.cancel()
    return elapsed / n * 1e6


async def run(n: int) -> None:
    ctx = zmq.Context()
    ipc_dir = tempfile.mkdtemp(prefix="zb", dir="/tmp")  # ipc paths must stay under ~100 chars
    try:
        for transport in ("inproc", "ipc", "tcp"):
            print(f"bus round trip over {transport}: {await round_trip_us(ctx, transport, ipc_dir, n):.1f} µs")
    finally:
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="messages per transport")
    trio.run(run, ap.parse_args().n)


if __name__ == "__main__":
    main()
