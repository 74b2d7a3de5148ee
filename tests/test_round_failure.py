"""A round the executor cannot compute fails that round's requests, not the engine: each
gets one Failed naming the device's error, their KV blocks are freed, and the engine serves
the next requests (issue 32: a kernel fault used to give every request a 500 and end `serve`).
"""

from __future__ import annotations

import pytest
import trio

from tiny import write_tiny_gguf
from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import TERMINAL_EVENTS, Delta, Failed, Finished
from zinfer.messages.params import SamplingParams


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama")


async def _run(client: AsyncClient, prompt: str, params: SamplingParams) -> tuple[list[int], list]:
    ids, events = [], []
    async for ev in client.generate(prompt, params=params):
        events.append(ev)
        if isinstance(ev, Delta):
            ids += ev.token_ids
    assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1 and isinstance(events[-1], TERMINAL_EVENTS)
    return ids, events


@pytest.mark.parametrize("device", ["cpu", "cpu-fast"])
@pytest.mark.parametrize("fail_at", [1, 3], ids=["prefill", "decode"])
async def test_a_round_that_raises_fails_its_requests_and_the_engine_serves_on(tiny_model, device, fail_at):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    async with (open_engine(EngineConfig(model=str(tiny_model), device=device, max_running=4)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        with trio.fail_after(120):
            alone, _ = await _run(client, "hello there", params)
            executor = engine.actors["executor"]
            compute, calls = executor.compute, {"n": 0}

            def faulty(*args, **kwargs):  # the device raises in one round, as a kernel fault would
                calls["n"] += 1
                if calls["n"] == fail_at:
                    raise ZeroDivisionError("division by zero")
                return compute(*args, **kwargs)

            executor.compute = faulty
            results = []

            async def one(i: int) -> None:
                results.append(await _run(client, f"hello {i}", params))

            async with trio.open_nursery() as n:
                for i in range(3):
                    n.start_soon(one, i)
            failed = [events[-1] for _, events in results if isinstance(events[-1], Failed)]
            assert failed, [events[-1] for _, events in results]
            assert all("the device failed this round: ZeroDivisionError: division by zero" in f.message
                       for f in failed), failed
            again, events = await _run(client, "hello there", params)  # the engine serves on
            assert isinstance(events[-1], Finished) and again == alone
            while (await client.stats()).kv_used_blocks:  # the failed requests' blocks were freed
                await trio.sleep(0.05)
        engine.actors["kv"].allocator.check_invariants()
        left = engine.actors["sampler"].samplers  # the last request's drop rides the next round
        assert len(left) <= 1, f"the failed requests' sampler state was kept: {sorted(left)}"
