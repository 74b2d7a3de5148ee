"""Soak: 1,000 mixed requests at concurrency 64 against the real SmolLM2 (cpu-fast), in process.

The mix: 10% cancelled mid-stream, 10% malformed, 5% over the context, 2% whose logits
a test-only sampler turns to NaN (tests/faults.py PoisonedSampler), the rest plain. Every request must
end with exactly one terminal event of the kind its class calls for, no KV block may
stay in use, and a greedy request afterwards must give the text it gave before.
Run with -s to see the figures.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import numpy as np
import pytest
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import TERMINAL_EVENTS, Cancelled, Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams
from faults import poisoned_sampler

pytestmark = pytest.mark.slow

N, CONCURRENCY, MAX_MODEL_LEN = 1000, 64, 512
MIX = {"cancel": 100, "malformed": 100, "too_long": 50, "poisoned": 20}  # the rest: "plain"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "The three primary colors are",
           "Water boils at", "My favourite fruit is"]
GREEDY_PROMPT = "The quick brown fox"
# (generate keywords, params): each one the engine (or the client, before sending) must reject as bad_request
MALFORMED = [
    ({"prompt": "hi"}, dict(temperature=-1.0)),
    ({"prompt": "hi"}, dict(top_p=0.0)),
    ({"prompt": "hi"}, dict(n=0)),
    ({"prompt": "hi"}, dict(stop=["x"] * 17)),
    ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, {}),
    ({}, {}),
    ({"prompt_ids": [10**9]}, {}),
    ({"prompt": "hi"}, dict(stop_token_ids=[10**12])),
    ({"prompt": "hi"}, dict(logit_bias={10**9: 1.0})),
    ({"prompt": "hi"}, dict(temperature=float("nan"))),
]


def expected_outcomes(kind: str) -> tuple[type, ...]:
    return {"cancel": (Cancelled, Finished), "malformed": (Rejected,), "too_long": (Rejected,), "poisoned": (Failed,),
            "plain": (Finished,)}[kind]


async def greedy(client: AsyncClient) -> str:
    text = []
    async for ev in client.generate(GREEDY_PROMPT, params=SamplingParams(temperature=0.0, max_tokens=12)):
        if isinstance(ev, Delta):
            text.append(ev.text)
        elif isinstance(ev, TERMINAL_EVENTS):
            assert isinstance(ev, Finished), ev
    return "".join(text)


async def wait_idle(client: AsyncClient):
    with trio.fail_after(60):
        while True:
            stats = await client.stats()
            if stats.open_requests == 0 and stats.running == 0 and stats.waiting == 0 and stats.kv_used_blocks == 0:
                return stats
            await trio.sleep(0.05)


async def test_soak_mixed_traffic_loses_nothing(smollm2_path, monkeypatch):
    poisoned_sampler(monkeypatch)
    rng = random.Random(2026)
    kinds = [k for k, n in MIX.items() for _ in range(n)]
    kinds += ["plain"] * (N - len(kinds))
    rng.shuffle(kinds)
    config = EngineConfig(model=str(smollm2_path), device="cpu-fast", max_model_len=MAX_MODEL_LEN, max_running=32,
                          num_blocks=512)
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        marker = engine.source.spec.vocab_size - 1  # a token no plain prompt holds: its rows get NaN logits
        plain_ids = {t for p in PROMPTS for t in await client.tokenize(p + " (123)")}
        assert marker not in plain_ids
        engine.actors["sampler"].poison = lambda ids, row: np.full_like(row, np.nan) if marker in ids else row  # [V]
        before = await greedy(client)

        terminals: list[list] = [[] for _ in range(N)]
        tokens = Counter()
        limiter = trio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            kind = kinds[i]
            params = dict(temperature=0.8, seed=i, max_tokens=rng.randint(2, 8))
            form: dict = {"prompt": f"{PROMPTS[i % len(PROMPTS)]} ({i})"}
            if kind == "too_long":
                form = {"prompt": "word " * (MAX_MODEL_LEN + 100)}
            elif kind == "poisoned":
                form = {"prompt_ids": await client.tokenize(form["prompt"]) + [marker]}
            elif kind == "malformed":
                form, bad = MALFORMED[i % len(MALFORMED)]
                params.update(bad)
            sampling = SamplingParams(**params)  # ranges are checked by the client and the engine, not here
            async with limiter:
                cancel = kind == "cancel"
                async for ev in client.generate(**form, params=sampling, request_id=f"r{i}"):
                    if isinstance(ev, TERMINAL_EVENTS):
                        terminals[i].append(ev)
                        tokens[type(ev).__name__] += getattr(getattr(ev, "usage", None), "completion_tokens", 0)
                    if cancel and isinstance(ev, Delta):
                        client.cancel(ev.request_id)
                        cancel = False

        t0 = time.perf_counter()
        with trio.fail_after(900):
            async with trio.open_nursery() as nursery:
                for i in range(N):
                    nursery.start_soon(one, i)
        wall = time.perf_counter() - t0

        outcomes = Counter((kinds[i], type(t[-1]).__name__ if t else "none") for i, t in enumerate(terminals))
        generated = sum(tokens.values())
        print(f"\nsoak: {N} requests at concurrency {CONCURRENCY} in {wall:.1f} s, {generated} tokens generated, "
              f"{generated / wall:.1f} tokens/s")
        for (kind, outcome), n in sorted(outcomes.items()):
            print(f"  {kind:10s} -> {outcome:10s} {n}")

        lost = [i for i, t in enumerate(terminals) if len(t) != 1]
        assert not lost, (f"{len(lost)} requests without exactly one terminal event, "
                          f"e.g. r{lost[0]}: {terminals[lost[0]]}")
        wrong = [(i, kinds[i], t[0]) for i, t in enumerate(terminals)
                 if not isinstance(t[0], expected_outcomes(kinds[i]))]
        assert not wrong, f"{len(wrong)} requests ended the wrong way, e.g. {wrong[:3]}"
        codes = Counter((kinds[i], t[0].code) for i, t in enumerate(terminals) if isinstance(t[0], Rejected))
        assert codes == Counter({("malformed", "bad_request"): MIX["malformed"],
                                 ("too_long", "too_long"): MIX["too_long"]}), codes

        stats = await wait_idle(client)
        assert stats.kv_used_blocks == 0
        assert engine.actors["kv"].allocator.num_used_blocks == 0
        engine.actors["kv"].allocator.check_invariants()
        del engine.actors["sampler"].poison  # back to the class's: rows unpoisoned
        assert await greedy(client) == before
