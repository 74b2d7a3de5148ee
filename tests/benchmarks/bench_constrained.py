"""Constrained decoding: its cost on decode, and the structured-output acceptance run (issue #17).

speed: the same chat prompt, max_tokens 64, temperature 0.8, at batch 1 and 16 streams,
side by side in one engine: free, under a JSON-schema constraint (masks prefetched in a
worker thread while the forward runs: the engine as shipped), and constrained with the
prefetch turned off (every mask computed after the logits arrive). Decode tok/s over all
streams (first token to last, so prefill is left out), median of --runs, and the median
time the sampler's loop spends per round (waiting for the prefetched masks, then
sampling): on a busy machine tok/s swing by 20%, the sampler's share of a round less.

schemas: --count varied pydantic models (tests/structured_schemas.py) asked for at
temperature 0.8 as response_format json_schema with strict: true takes them (objects
closed: gateway/openai_constraints.py closed_objects); every output must parse and validate
(pydantic's model_validate_json); outputs cut by max_tokens are counted apart. The same run
through the official openai client against `zinfer serve`, one line per schema, is
tests/benchmarks/schema_acceptance.py.

    python tests/benchmarks/bench_constrained.py speed [--models smollm2-135m qwen2.5-coder-0.5b] [--runs 3]
    python tests/benchmarks/bench_constrained.py schemas [--models qwen2.5-coder-0.5b] [--count 50] [--max-tokens 800]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.openai_constraints import closed_objects
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import Constraint, SamplingParams
from zinfer.traces.logs import configure_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from structured_schemas import models as schema_models  # noqa: E402

ASK = [{"role": "user", "content": "List people you know as JSON: name, age and city of each."}]
PEOPLE = {  # never complete within 64 tokens, so every stream decodes 64 tokens
    "type": "array",
    "minItems": 20,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string"},
        },
        "required": ["name", "age", "city"],
    },
}


async def decode_rate(client: AsyncClient, streams: int, params: SamplingParams) -> float:
    """Decode tokens per second over `streams` concurrent requests of params."""
    first, last, tokens = [], [], []

    async def one(i: int) -> None:
        t_first, n = None, 0
        async for ev in client.generate(messages=ASK, params=params):
            if isinstance(ev, Delta) and ev.token_ids:
                t_first = t_first or time.perf_counter()
                n += len(ev.token_ids)
        first.append(t_first)
        last.append(time.perf_counter())
        tokens.append(n - 1)

    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(one, i)
    return sum(tokens) / (max(last) - min(first))


async def speed(model: str, runs: int) -> None:
    cfg = EngineConfig(model=model, device="cpu-fast", max_running=16)
    async with open_engine(cfg) as engine:
        sampler = engine.actors["sampler"]
        prefetch_start = sampler.prefetch.start
        spent: list[float] = []  # seconds the sampler's loop spent per round: waiting for masks, then sampling
        sample_round, wait = sampler.sample_round, sampler.prefetch.wait

        def timed_round(msg, *grammars):
            t = time.perf_counter()
            out = sample_round(msg, *grammars)
            spent[-1] += time.perf_counter() - t
            return out

        async def timed_wait():
            t = time.perf_counter()
            await wait()
            spent.append(time.perf_counter() - t)

        sampler.sample_round, sampler.prefetch.wait = timed_round, timed_wait
        base = dict(temperature=0.8, top_p=0.95, max_tokens=64, ignore_eos=True, seed=7)
        free = SamplingParams(**base)
        constrained = SamplingParams(**base, constraint=Constraint("json_schema", json.dumps(PEOPLE)))
        async with AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            await decode_rate(client, 1, constrained)  # warm up: kernels compiled, llguidance's vocabulary built
            for streams in (1, 16):
                rates: dict[str, list[float]] = {"free": [], "constrained": [], "constrained, no prefetch": []}
                loop_ms: dict[str, list[float]] = {k: [] for k in rates}
                for _ in range(runs):
                    for name, params, prefetch in [("free", free, True), ("constrained", constrained, True),
                                                   ("constrained, no prefetch", constrained, False)]:
                        sampler.prefetch.start = prefetch_start if prefetch else (lambda nursery, masks: None)
                        spent.clear()
                        rates[name].append(await decode_rate(client, streams, params))
                        loop_ms[name].extend(1e3 * x for x in spent)
                sampler.prefetch.start = prefetch_start
                med = {k: statistics.median(v) for k, v in rates.items()}
                cells = ", ".join(f"{k} {v:.1f} (sampler {statistics.median(loop_ms[k]):.2f} ms/round)"
                                  for k, v in med.items())
                cost = 100 * (1 - med["constrained"] / med["free"])
                cost_np = 100 * (1 - med["constrained, no prefetch"] / med["free"])
                print(f"{model} cpu-fast, {streams:2d} stream(s), decode tok/s: {cells}; "
                      f"cost {cost:.1f}% (no prefetch {cost_np:.1f}%)", flush=True)


async def schemas(model: str, count: int, max_tokens: int, concurrency: int) -> None:
    ms = schema_models(count)
    outcome: dict[str, list[str]] = {"valid": [], "length": [], "invalid": []}
    cfg = EngineConfig(model=model, device="cpu-fast", max_running=concurrency)
    t0 = time.perf_counter()
    async with open_engine(cfg) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        limit = trio.Semaphore(concurrency)

        async def one(i: int, m) -> None:
            schema = json.dumps(closed_objects(m.model_json_schema()))  # as the gateway takes it with strict: true
            ask = [{"role": "user",
                    "content": f"Give an example of a {m.__name__} as JSON matching this schema: {schema}"}]
            params = SamplingParams(temperature=0.8, max_tokens=max_tokens, seed=i,
                                    constraint=Constraint("json_schema", schema))
            async with limit:
                text, reason = "", None
                async for ev in client.generate(messages=ask, params=params):
                    if isinstance(ev, Delta):
                        text += ev.text
                    elif isinstance(ev, Finished):
                        reason = ev.finish_reasons[0]
            if reason == "length":
                outcome["length"].append(m.__name__)
                return
            try:
                m.model_validate_json(text)
                outcome["valid"].append(m.__name__)
            except Exception as exc:
                outcome["invalid"].append(f"{m.__name__}: {reason} {text[:200]!r} {str(exc)[:200]}")

        async with trio.open_nursery() as nursery:
            for i, m in enumerate(ms):
                nursery.start_soon(one, i, m)
    n_done = count - len(outcome["length"])
    print(f"{model} cpu-fast: {count} schemas at temperature 0.8, max_tokens {max_tokens}: "
          f"{len(outcome['valid'])}/{n_done} finished outputs parse and validate "
          f"({100 * len(outcome['valid']) / max(n_done, 1):.0f}%), {len(outcome['length'])} hit max_tokens, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    for line in outcome["invalid"]:
        print("  invalid:", line)
    for name in outcome["length"]:
        print("  length:", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["speed", "schemas"])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=800)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    configure_logging(level="info")  # stderr: the "grammar tokenizer built" line says what the vocabulary cost
    for model in args.models or (["smollm2-135m", "qwen2.5-coder-0.5b"] if args.mode == "speed"
                                 else ["qwen2.5-coder-0.5b"]):
        if args.mode == "speed":
            trio.run(speed, model, args.runs)
        else:
            trio.run(schemas, model, args.count, args.max_tokens, args.concurrency)


if __name__ == "__main__":
    main()
