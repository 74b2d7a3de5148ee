"""`zinfer bench`: the engine's throughput and latency, optionally side by side with llama.cpp.

One command measures every workload, each on distinct synthetic prompts (no prefix
cache hits), greedy with EOS ignored:

- prefill: --prefill-requests prompts of --prefill-len tokens one at a time, one
  output token each: prompt tokens per second.
- decode, batch 1: --decode-requests prompts of --prompt-len tokens one at a time,
  --output-len tokens each: the decode-window rate (gateway/bench_figures.py).
- streams: for each N in --streams, N such requests arriving together: the end-to-end
  rate (first arrival to last completion) and the decode-window rate.
- GB/s at batch 1: bytes each decoded token reads (gateway/bench_roofline.py) times the
  batch-1 rate, against this machine's read bandwidth measured at the end.

With --compare-llama-cpp, llama.cpp runs the same prompts on the same thread count
(gateway/bench_llama.py), each sequence in its own KV stream, and once more at the
largest stream count with one unified KV pool; the table prints zinfer / llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import msgspec
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.bench_figures import Stream, summarize
from zinfer.gateway.bench_llama import bench_llama_cpp
from zinfer.gateway.bench_plan import Plan, say, synthetic_prompts, workload_prompts
from zinfer.gateway.bench_report import print_table, report_of
from zinfer.gateway.bench_roofline import (
    file_weight_bytes, kv_bytes_per_token, kv_itemsize, read_bandwidth, resident_weight_bytes,
)
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams
from zinfer.models.loader import resolve


async def _group(client: AsyncClient, prompts: list[list[int]], max_tokens: int, speculative: str | None = None
                 ) -> tuple[float, list[Stream]]:
    """Send every prompt at once; (arrival time, each request's token arrival times). speculative:
    each request's drafts ("off", "ngram"; None: the server's default)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, speculative=speculative)
    streams: list[Stream] = [[] for _ in prompts]

    async def one(ids: list[int], times: Stream) -> None:
        async for ev in client.generate(prompt_ids=ids, params=params):
            if isinstance(ev, Delta):
                times.extend([time.perf_counter()] * len(ev.token_ids))  # tokens of one event arrive together
            elif not isinstance(ev, Finished) and hasattr(ev, "message"):
                raise RuntimeError(f"bench request failed: {ev.message}")

    start = time.perf_counter()
    async with trio.open_nursery() as n:
        for ids, times in zip(prompts, streams):
            n.start_soon(one, ids, times)
    return start, streams


async def bench_engine(config: EngineConfig, plan: Plan) -> dict[str, Any]:
    """Every workload on zinfer; its figures by workload key, plus the model's bytes."""
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        vocab = engine.source.spec.vocab_size
        prompts = workload_prompts(plan, vocab)
        # warm-up: kernels compile or load from cache on first use,
        warm = synthetic_prompts(3, plan.prompt_len, vocab, seed=0)
        await _group(client, warm[:1], 3)  # alone (prefill, batch-1 decode)
        await _group(client, warm[1:], 3)  # and together (decode of several rows)
        executor = engine.actors.get("executor")
        if executor is not None and not await trio.to_thread.run_sync(executor.device.settle, 300.0):
            say("zinfer: the device's background compile outlasted 300 s; timing anyway")
        busy0, rounds0, t0 = getattr(executor, "busy_seconds", 0.0), (await client.stats()).rounds, time.perf_counter()
        say("zinfer: prefill")
        one_at_a_time = [await _group(client, [ids], 1) for ids in prompts["prefill"]]
        prefill_s = sum(s[0][-1] - t for t, s in one_at_a_time)
        result: dict[str, Any] = {"prefill": {"prefill_tok_s": plan.prefill_requests * plan.prefill_len / prefill_s}}
        # --speculate: the plain workloads with drafts off, then each once more with drafts ("..._spec")
        mode = config.speculation.mode
        plain = "off" if mode != "off" else None
        say("zinfer: decode, batch 1")
        result["decode_b1"] = summarize(
            [await _group(client, [ids], plan.output_len, plain) for ids in prompts["decode_b1"]])
        for n in plan.streams:
            say(f"zinfer: {n} streams")
            result[f"streams_{n}"] = summarize([await _group(client, prompts[f"streams_{n}"], plan.output_len, plain)])
        if mode != "off":
            before = await client.stats()
            say(f"zinfer: decode, batch 1, speculative {mode}")
            result["decode_b1_spec"] = summarize(
                [await _group(client, [ids], plan.output_len, mode) for ids in prompts["decode_b1"]])
            for n in plan.streams:
                say(f"zinfer: {n} streams, speculative {mode}")
                result[f"streams_{n}_spec"] = summarize(
                    [await _group(client, prompts[f"streams_{n}"], plan.output_len, mode)])
            after = await client.stats()
            result["speculation"] = {"mode": mode, "drafted_tokens": after.drafted_tokens - before.drafted_tokens,
                                     "accepted_tokens": after.accepted_tokens - before.accepted_tokens}
        spec = engine.source.spec
        result["model"] = engine.source.name
        result["device"] = engine.config.device  # the resolved device (auto -> ...)
        result["weight_file_bytes"] = file_weight_bytes(engine.source)
        result["kv_context"] = plan.prompt_len + plan.output_len // 2  # the mean context of the batch-1 decode steps
        result["kv_bytes_per_token_f16"] = kv_bytes_per_token(spec, result["kv_context"], 2)  # llama.cpp's default KV
        if executor is not None:  # in this process (the inproc topology): what the device holds
            rounds = (await client.stats()).rounds - rounds0  # the scheduler's count as of its last round
            result["rounds"] = rounds
            outside_s = time.perf_counter() - t0 - (executor.busy_seconds - busy0)
            result["bus_overhead_ms_per_round"] = 1000 * outside_s / max(rounds, 1)
            result["weight_resident_bytes"] = resident_weight_bytes(executor.weights)
            result["kv_bytes_per_token"] = kv_bytes_per_token(spec, result["kv_context"], kv_itemsize(executor.kv, 4))
        return result


def bench_config(config: EngineConfig, plan: Plan) -> EngineConfig:
    """config sized for the plan: --max-running raised to the largest stream count (so
    every stream of a group runs at once), and, where left at 0, the context and KV
    blocks to what the longest sequence needs."""
    running = max((config.max_running, *plan.streams))
    ctx = config.max_model_len or plan.max_len
    blocks = config.num_blocks or running * -(-ctx // config.block_size)
    return msgspec.structs.replace(config, max_running=running, max_model_len=ctx, num_blocks=blocks)


def bench_main(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run the plan on zinfer, then (--compare-llama-cpp) on llama.cpp, then measure the
    read bandwidth (last, so its numba threads run beside neither); print the report."""
    plan = Plan.from_args(args)
    threads = args.threads or os.cpu_count() or 1
    ours = trio.run(bench_engine, bench_config(config, plan), plan)
    theirs = unified = None
    if args.compare_llama_cpp:
        theirs, unified = bench_llama_cpp(str(resolve(config.model)), plan, threads, args.unified_pool)
    if args.bandwidth_mib > 0:
        say("read bandwidth")
    peak = read_bandwidth(threads, args.bandwidth_mib << 20) if args.bandwidth_mib > 0 else None
    report = report_of(plan, threads, ours, theirs, unified, peak)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0

