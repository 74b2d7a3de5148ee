"""The incremental KV messages on the real SmolLM2: a small pool with prefix caching on,
prompts sharing a prefix, preemption and recompute, and still the same greedy text."""

from __future__ import annotations

import pytest
import trio

from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams

pytestmark = pytest.mark.slow  # every test here loads a real model

BLOCKS = 24  # of 16 tokens: 384 token slots for 6 sequences that grow to ~100 tokens each
PREFIX = "You are a patient teacher. Count slowly, one number per line, and never skip a number. "
PARAMS = SamplingParams(temperature=0, max_tokens=72, ignore_eos=True)


@pytest.fixture(scope="module")
def small_engine(smollm2_path):
    with EngineThread(EngineConfig(model=str(smollm2_path), device="cpu", max_running=8, num_blocks=BLOCKS,
                                   prefix_caching=True)) as e:
        yield e


async def _run(client: AsyncClient, prompt: str) -> tuple[list[int], Finished]:
    ids, last = [], None
    async for ev in client.generate(prompt, params=PARAMS):
        if isinstance(ev, Delta):
            ids += ev.token_ids
        last = ev
    assert isinstance(last, Finished) and last.finish_reasons == ["length"], last
    return ids, last


async def test_shared_prefix_under_preemption_keeps_greedy_text(small_engine):
    prompts = [PREFIX + f"Start at {i}:" for i in range(6)]
    scheduler = small_engine.engine.actors["scheduler"]
    async with AsyncClient(small_engine.ctx, small_engine.address) as client:
        alone = {}
        for p in prompts[:3]:  # one at a time; these also fill the prefix cache
            alone[p], fin = await _run(client, p)
        assert fin.usage.cached_tokens >= 16  # the shared prefix's full blocks were reused
        before = scheduler.preemptions
        results = {}

        async def one(p: str) -> None:
            results[p] = await _run(client, p)

        with trio.fail_after(300):
            async with trio.open_nursery() as n:
                for p in prompts:
                    n.start_soon(one, p)
        assert scheduler.preemptions > before, "the pool was never exhausted"
        assert all(len(ids) == PARAMS.max_tokens for ids, _ in results.values())
        assert {p: results[p][0] for p in alone} == alone  # batched, preempted and recomputed: the same ids
        small_engine.engine.actors["kv"].allocator.check_invariants()
        await _run(client, prompts[0])  # its rounds tell the executor to forget the six
        assert len(small_engine.engine.actors["executor"].tables) <= 1, "the executor keeps ended sequences' tables"
