"""The router alone: requests per second and the time it adds per request, against stub
replicas (tests/router_stubs.py) in another process, so this process holds the router only.

Each request is a text prompt (a chat-sized system prompt plus a question, ~100 tokens)
that the router keys on (its bytes, or with --key tokens its tokens), and asks for one token. The same requests
go straight to one stub through an AsyncClient (no router) for the baseline; the router's
added time per request is the difference of the mean latencies at concurrency 1, and its
throughput is measured at concurrency 64.

    python tests/benchmarks/bench_router.py [--requests 20000] [--policy prefix] [--key text|tokens]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import trio
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router_stubs import StubReplica  # noqa: E402
from zinfer.gateway.client import AsyncClient  # noqa: E402
from zinfer.gateway.router import Router, RouterOptions  # noqa: E402
from zinfer.gateway.router_links import StaticReplicas  # noqa: E402
from zinfer.gateway.router_policy import RoutePolicy  # noqa: E402
from zinfer.messages.client import Generate  # noqa: E402
from zinfer.messages.params import SamplingParams  # noqa: E402
from zinfer.models.loader import open_model  # noqa: E402
from zinfer.models.prompt import PromptBuilder  # noqa: E402

ONE = SamplingParams(temperature=0.0, max_tokens=1)
SYSTEM = "You are a careful assistant. Answer briefly and cite the section you used. " * 4


def prompt(i: int) -> str:
    return f"{SYSTEM}\nQuestion {i}: what does clause {i % 97} of the contract say about renewals?"


async def serve_stubs(n: int) -> None:
    """The child process: n stubs; prints their endpoints, serves until stdin closes."""
    prompts = PromptBuilder.from_source(open_model("smollm2-135m"))
    ctx = zmq.Context()
    stubs = [StubReplica(ctx, prompts) for _ in range(n)]
    async with trio.open_nursery() as nursery:
        for s in stubs:
            await nursery.start(s.run)
        print(" ".join(s.endpoint for s in stubs), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


async def timed(generate, n: int, concurrency: int) -> tuple[float, float, float]:
    """(requests per second, mean latency in ms, this process's CPU µs per request) of n
    one-token requests at the concurrency. The CPU time is the measure that holds on a
    loaded host: 1e6 / µs per request is what one core of this process could route."""
    limit = trio.Semaphore(concurrency)
    total = 0.0

    async def one(i: int) -> None:
        nonlocal total
        async with limit:
            t = time.perf_counter()
            async for _ in generate(prompt(i), params=ONE):
                pass
            total += time.perf_counter() - t

    t0, cpu0 = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n / wall, total / n * 1000, cpu / n * 1e6


def key_costs(prompts: PromptBuilder, n: int = 2000) -> dict[str, float]:
    """CPU µs of one request's affinity chain by key kind (no I/O: the routing path's own cost)."""
    out = {}
    for key in ("tokens", "text"):
        router = Router(zmq.Context.instance(), StaticReplicas({}), RouterOptions(policy=RoutePolicy(key=key)), prompts)
        reqs = [Generate(str(i), prompt(i)) for i in range(n)]
        t0 = time.process_time()
        for r in reqs:
            router._chain(r)
        out[key] = (time.process_time() - t0) / n * 1e6
    return out


async def main(args: argparse.Namespace) -> None:
    child = subprocess.Popen([sys.executable, __file__, "--child", str(args.stubs)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    endpoints = child.stdout.readline().split()
    prompts = PromptBuilder.from_source(open_model("smollm2-135m"))
    ctx = zmq.Context()
    n = args.requests
    try:
        async with AsyncClient(ctx, endpoints[0]) as direct:
            await timed(direct.generate, 500, 1)  # warm
            _, d_lat1, _ = await timed(direct.generate, n // 10, 1)
            d_rps, d_lat, d_cpu = await timed(direct.generate, n, 64)
        source = StaticReplicas({f"stub-{i}": e for i, e in enumerate(endpoints)})
        options = RouterOptions(policy=RoutePolicy(kind=args.policy, key=args.key))
        async with Router(ctx, source, options, prompts) as router:
            await router.wait_up(len(endpoints))
            await timed(router.generate, 500, 1)
            _, r_lat1, _ = await timed(router.generate, n // 10, 1)
            r_rps, r_lat, r_cpu = await timed(router.generate, n, 64)
    finally:
        child.stdin.close()
        child.wait()
        ctx.destroy(linger=0)
    print(f"policy {args.policy} (key {args.key}), {len(endpoints)} stub replicas, {n} requests")
    print(f"concurrency 1:  direct {d_lat1:.3f} ms/request, router {r_lat1:.3f} ms: "
          f"the router adds {r_lat1 - d_lat1:.3f} ms")
    print(f"concurrency 64: direct {d_rps:.0f} requests/s, router {r_rps:.0f} requests/s "
          f"(mean latency {d_lat:.2f} / {r_lat:.2f} ms)")
    costs = key_costs(prompts)
    print(f"the prefix policy's affinity chain per request, CPU: key tokens {costs['tokens']:.1f} µs, "
          f"key text {costs['text']:.1f} µs")
    print(f"CPU of this process per request: direct {d_cpu:.0f} µs, router {r_cpu:.0f} µs: the router's own "
          f"{r_cpu - d_cpu:.0f} µs, {1e6 / max(1.0, r_cpu - d_cpu):.0f} requests/s per core")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        trio.run(serve_stubs, int(sys.argv[2]))
    else:
        ap = argparse.ArgumentParser()
        ap.add_argument("--requests", type=int, default=20000)
        ap.add_argument("--stubs", type=int, default=2)
        ap.add_argument("--policy", default="prefix", choices=("prefix", "load", "round_robin"))
        ap.add_argument("--key", default="text", choices=("text", "tokens"),
                        help="prefix keys on the prompt's bytes or on its tokens' KV blocks")
        trio.run(main, ap.parse_args())
