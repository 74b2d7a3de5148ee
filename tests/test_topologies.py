"""The same actors in other topologies: a process per actor over ipc:// and tcp://."""

from __future__ import annotations

import time

import pytest
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.actors.processes import EngineFailure
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Failed, Finished
from zinfer.messages.params import SamplingParams

PROMPTS = ["The capital of France is", "def add(a, b):", "Roses are red,", "The sun rises in the"]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


async def run_one(client: AsyncClient, prompt: str) -> tuple[list[int], object]:
    ids = []
    async for ev in client.generate(prompt, params=GREEDY):
        if isinstance(ev, Delta):
            ids += ev.token_ids
    return ids, ev


async def test_process_topology_matches_in_process(smollm2_path):
    async with open_engine(EngineConfig(model=str(smollm2_path))) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        single = {p: (await run_one(client, p))[0] for p in PROMPTS}
    results = {}
    async with open_engine(EngineConfig(model=str(smollm2_path), topology="ipc")) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        assert all(p.returncode is None for p in engine.actors["processes"].values())

        async def one(i: int) -> None:
            ids, last = await run_one(client, PROMPTS[i % 4])
            assert isinstance(last, Finished)
            results[i] = ids

        async with trio.open_nursery() as n:
            for i in range(32):
                n.start_soon(one, i)
    same = sum(results[i] == single[PROMPTS[i % 4]] for i in range(32))
    assert same >= 30, f"{same}/32 equal the in-process single-request output"


async def test_tcp_topology_generates(smollm2_path):
    async with open_engine(EngineConfig(model=str(smollm2_path), topology="tcp")) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        assert engine.addrs.executor.startswith("tcp://127.0.0.1:")
        ids, last = await run_one(client, PROMPTS[0])
        assert isinstance(last, Finished) and len(ids) == 8


async def test_killing_the_executor_fails_open_requests_fast(smollm2_path):
    failed_after: list[float] = []
    started = trio.Event()
    with pytest.raises(BaseExceptionGroup) as info:
        async with open_engine(EngineConfig(model=str(smollm2_path), topology="ipc")) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            killed_at = [0.0]

            async def stream(i: int) -> None:
                # ignore_eos: a stream that samples EOS first would finish before the kill
                async for ev in client.generate(f"Tell me a long story number {i}.", params=SamplingParams(max_tokens=500, ignore_eos=True)):
                    if isinstance(ev, Delta):
                        started.set()
                    if isinstance(ev, Failed):
                        failed_after.append(time.monotonic() - killed_at[0])

            async with trio.open_nursery() as n:
                for i in range(4):
                    n.start_soon(stream, i)
                await started.wait()
                killed_at[0] = time.monotonic()
                engine.actors["processes"]["executor"].kill()
    assert info.group_contains(EngineFailure, match="executor")
    assert len(failed_after) == 4 and max(failed_after) < 1.0, failed_after
