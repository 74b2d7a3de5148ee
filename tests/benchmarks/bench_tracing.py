"""Tracing overhead, side by side in one process: 8 requests x 16 tokens, median of 3
runs, with tracing off and with kernel-level tracing on (spans to part files); then,
less exposed to a busy machine, one batch-8 decode forward alone, interleaved plain
and traced (recorder, round span, kernel record written), median of many.

    python tests/benchmarks/bench_tracing.py [--model smollm2-135m] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient
from zinfer.messages.params import SamplingParams
from zinfer.models.pull import DEFAULT_MODEL
from zinfer.traces.config import TraceConfig
from zinfer.traces.logs import configure_logging

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "The three primary colors are",
           "Water boils at", "My favourite fruit is", "In 1969, the first man", "The quick brown fox"]


async def one_run(client: AsyncClient, tokens: int) -> float:
    """Seconds to generate `tokens` tokens for each prompt, all at once."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)

    async def one(p: str) -> None:
        async for _ in client.generate(p, params=params):
            pass

    t0 = time.perf_counter()
    async with trio.open_nursery() as n:
        for p in PROMPTS:
            n.start_soon(one, p)
    return time.perf_counter() - t0


async def bench(model: str, runs: int, tokens: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        configs = {"off": TraceConfig(), "kernels": TraceConfig(dir=tmp)}
        engines = {}
        results: dict[str, list[float]] = {k: [] for k in configs}
        for name, trace in configs.items():
            engines[name] = open_engine(EngineConfig(model=model, trace=trace))
        async with engines["off"] as off, engines["kernels"] as on:
            clients = {"off": AsyncClient(off.ctx, off.addrs.frontend),
                       "kernels": AsyncClient(on.ctx, on.addrs.frontend)}
            async with clients["off"], clients["kernels"]:
                for name in configs:  # warm-up: numba compiles, caches fill
                    await one_run(clients[name], tokens)
                for _ in range(runs):  # alternate, so drift hits both alike
                    for name in configs:
                        results[name].append(await one_run(clients[name], tokens))
    total = len(PROMPTS) * tokens
    med = {k: statistics.median(v) for k, v in results.items()}
    for k, v in results.items():
        print(f"tracing {k:8s}: median {med[k]:.3f} s  ({total / med[k]:.1f} tok/s)  runs {[round(x, 3) for x in v]}")
    print(f"overhead of kernel-level tracing: {100 * (med['kernels'] / med['off'] - 1):+.1f}%")


def bench_forward(model: str, reps: int) -> None:
    """Median time of one batch-8 decode round, plain vs traced."""
    from zinfer.devices.registry import make_device
    from zinfer.devices.batch import ForwardBatch
    from zinfer.models.forward import round_logits
    from zinfer.models.loader import open_model
    from zinfer.models.weights import build_weights
    from zinfer.traces.rounds import RoundTracer
    from zinfer.traces.setup import Tracing

    source = open_model(model)
    spec, dev = source.spec, make_device("cpu")
    weights = build_weights(spec, source.tensors, dev.upload)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 64, 16)
    batch = ForwardBatch.build([([17], 40, list(range(i * 4, i * 4 + 4)), True) for i in range(8)], 16)
    with tempfile.TemporaryDirectory() as tmp:
        tracing = Tracing(TraceConfig(dir=tmp), "bench")
        rt = RoundTracer(tracing, dev)
        plain, traced = [], []
        for i in range(reps + 3):
            t0 = time.perf_counter()
            round_logits(spec, weights, dev, kv, batch)
            t1 = time.perf_counter()
            rt.run(round_logits, spec, weights, rt.device, kv, batch)
            rt.finish("decode", {"round_id": i, "batch_size": 8}, [])
            t2 = time.perf_counter()
            if i >= 3:
                plain.append(t1 - t0)
                traced.append(t2 - t1)
        n_events = len(rt.recorder.events) if rt.recorder else 0
        tracing.close()
    a, b = statistics.median(plain), statistics.median(traced)
    print(f"decode round, batch 8, alone: plain {a * 1e3:.2f} ms, traced {b * 1e3:.2f} ms: {100 * (b / a - 1):+.1f}% "
          f"({reps} interleaved pairs; {n_events} events left unwritten)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--forward-reps", type=int, default=50)
    args = ap.parse_args()
    configure_logging("warning")
    trio.run(bench, args.model, args.runs, args.tokens)
    bench_forward(args.model, args.forward_reps)


if __name__ == "__main__":
    main()
