"""`zinfer bench`: throughput and latency of the engine, optionally side by side with llama.cpp.

Two phases on distinct synthetic prompts of exactly --prompt-len tokens (no prefix
cache hits): prefill (each request asks for one token) and generation (--output-len
tokens each, EOS ignored), in groups of --concurrency requests started together.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams


def bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--compare-llama-cpp", action="store_true", help="run llama.cpp (llama-cpp-python) on the same model, prompts and threads")
    # --threads (engine_args) sets llama.cpp's threads and cpu-fast's: one count for both


def synthetic_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n distinct prompts of `length` token ids (ordinary ids, away from the special ones)."""
    rng = np.random.default_rng(seed)
    lo, hi = min(1000, vocab // 4), min(vocab, 30000)
    return [rng.integers(lo, hi, size=length).tolist() for _ in range(n)]


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99))}


async def _phase(client: AsyncClient, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Run the prompts in groups of `concurrency` started together, as llama.cpp's side does.

    Aggregate decode rate: in each group, the tokens that arrive while every member is
    past its first token and none has finished, over that window's length.
    """
    ttfts: list[float] = []
    itls: list[float] = []
    window_tokens, window_s = 0, 0.0
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    async def one(ids: list[int], times: list[float]) -> None:
        t0 = time.perf_counter()
        async for ev in client.generate(prompt_ids=ids, params=params):
            if isinstance(ev, Delta):
                times.extend([time.perf_counter()] * len(ev.token_ids))
            elif not isinstance(ev, Finished) and hasattr(ev, "message"):
                raise RuntimeError(f"bench request failed: {ev.message}")
        ttfts.append(times[0] - t0)
        itls.extend(np.diff(times).tolist())

    start = time.perf_counter()
    for g in range(0, len(prompts), concurrency):
        group = [[] for _ in prompts[g : g + concurrency]]
        async with trio.open_nursery() as n:
            for ids, times in zip(prompts[g : g + concurrency], group):
                n.start_soon(one, ids, times)
        lo, hi = max(t[0] for t in group), min(t[-1] for t in group)
        if hi > lo:
            window_tokens += sum(lo < x <= hi for t in group for x in t)
            window_s += hi - lo
    return {"wall_s": time.perf_counter() - start, "ttft": percentiles(ttfts), "itl": percentiles(itls), "decode_tokens": window_tokens, "decode_time_s": window_s}


async def bench_engine(config: EngineConfig, args: argparse.Namespace) -> dict:
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        prompts = synthetic_prompts(args.requests, args.prompt_len, engine.source.spec.vocab_size)
        await _phase(client, prompts[:1], 1, 2)  # warm-up (JIT, caches)
        executor = engine.actors.get("executor")
        busy0 = executor.busy_seconds if executor else 0.0
        rounds0 = engine.actors["scheduler"].round_id if "scheduler" in engine.actors else 0
        pre = await _phase(client, synthetic_prompts(args.requests, args.prompt_len, engine.source.spec.vocab_size, seed=1), args.concurrency, 1)
        gen = await _phase(client, prompts, args.concurrency, args.output_len)
        result = {
            "model": engine.source.name,
            "device": engine.config.device,  # the resolved one (auto -> cuda, cpu-fast or cpu)
            "requests": args.requests,
            "concurrency": args.concurrency,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "prefill_tok_s": args.requests * args.prompt_len / pre["wall_s"],
            "decode_tok_s": gen["decode_tokens"] / gen["decode_time_s"] if gen["decode_time_s"] > 0 else 0.0,
            "ttft": gen["ttft"],
            "itl": gen["itl"],
        }
        if executor:
            rounds = engine.actors["scheduler"].round_id - rounds0
            busy = executor.busy_seconds - busy0
            wall = pre["wall_s"] + gen["wall_s"]
            result["rounds"] = rounds
            result["bus_overhead_ms_per_round"] = 1000 * (wall - busy) / max(rounds, 1)
        return result


def bench_main(args: argparse.Namespace, config: EngineConfig) -> int:
    ours = trio.run(bench_engine, config, args)
    report = {"zinfer": ours}
    if args.compare_llama_cpp:
        from zinfer.gateway.bench_llama import bench_llama_cpp
        from zinfer.models.loader import resolve

        theirs = bench_llama_cpp(str(resolve(config.model)), args, ours)
        report["llama_cpp"] = theirs
        report["ratio"] = {k: ours[k] / theirs[k] for k in ("prefill_tok_s", "decode_tok_s") if theirs.get(k)}
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


def print_table(report: dict) -> None:
    ours = report["zinfer"]
    theirs = report.get("llama_cpp", {})
    print(f"model {ours['model']}  device {ours['device']}  {ours['requests']} requests, concurrency {ours['concurrency']}, prompt {ours['prompt_len']}, output {ours['output_len']}")
    print(f"{'':28}{'zinfer':>12}{'llama.cpp':>12}{'ratio':>8}")
    for key, label in (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s (aggregate)")):
        other = theirs.get(key)
        ratio = report.get("ratio", {}).get(key)
        other_s = f"{other:12.1f}" if other else f"{'-':>12}"
        ratio_s = f"{ratio:8.2f}" if ratio else f"{'-':>8}"
        print(f"{label:28}{ours[key]:12.1f}{other_s}{ratio_s}")
    for key in ("ttft", "itl"):
        p = ours[key]
        if p:
            print(f"{key + ' ms p50/p90/p99':28}{p['p50_ms']:8.1f} / {p['p90_ms']:.1f} / {p['p99_ms']:.1f}")
    if "bus_overhead_ms_per_round" in ours:
        print(f"{'rounds':28}{ours['rounds']:12d}")
        print(f"{'time outside forward/round':28}{ours['bus_overhead_ms_per_round']:10.2f}ms")
