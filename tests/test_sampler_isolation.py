"""One request's sampling failure is that request's alone: non-finite logits, bad sampler
state or a broken row fail it with `Failed`, and the engine serves everyone else on."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import zmq

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.actors.sampler_actor import SamplerActor
from zinfer.actors.sampling import RequestSampler
from zinfer.actors.topology import Addresses
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import TERMINAL_EVENTS, Delta, Failed, Finished
from zinfer.messages.engine import RoundLogits, SamplerAdd
from zinfer.messages.params import SamplingParams
from faults import poisoned_sampler
from tiny import write_tiny_gguf

VOCAB = 16


@pytest.mark.parametrize("params", [SamplingParams(temperature=0),
                                    SamplingParams(temperature=0.8, top_k=4, repetition_penalty=1.3)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, "all -inf"])
def test_non_finite_logits_raise_naming_the_sequence(params, bad):
    sampler = RequestSampler(params, [1, 2], VOCAB, seq_id=42)
    row = np.zeros(VOCAB, np.float32)  # [vocab]
    if bad == "all -inf":
        row[:] = -np.inf
    else:
        row[5] = bad
    with pytest.raises(ValueError, match="logits of seq 42 are not finite"):
        sampler.sample(row)


def test_sample_round_fails_only_the_broken_rows():
    ctx = zmq.Context()
    try:
        actor = SamplerActor(ctx, Addresses.inproc(), VOCAB)
        try:
            updates = [
                SamplerAdd(1, SamplingParams(temperature=0), [1]),
                SamplerAdd(2, SamplingParams(temperature=0), [2]),
                SamplerAdd(3, SamplingParams(temperature=0), [VOCAB + 5]),  # a prompt id outside the vocabulary
            ]
            logits = np.zeros((4, VOCAB), np.float32)  # [rows, vocab]
            logits[0, 7] = logits[1, 9] = 1.0
            logits[1, 3] = np.nan
            out = actor.sample_round(RoundLogits(1, [1, 2, 3, 99], logits, updates))
            by_seq = {t.seq_id: t for t in out.tokens}
            assert by_seq[1].token_id == 7 and by_seq[1].error is None
            assert by_seq[2].token_id == -1 and "logits of seq 2 are not finite" in by_seq[2].error.message
            assert by_seq[3].token_id == -1 and "outside vocabulary" in by_seq[3].error.message
            assert by_seq[99].token_id == -1 and "no sampling state" in by_seq[99].error.message
            assert len(out.tokens) == 4 and set(actor.samplers) == {1}  # failed state is dropped
        finally:
            actor.inbox.close()
            actor.to_scheduler.close()
    finally:
        ctx.destroy(linger=0)


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


async def test_poisoned_row_fails_its_request_alone(tiny_model, monkeypatch):
    poisoned_sampler(monkeypatch)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    healthy, poisoned = "hello there world", "zebra quartz"
    async with (open_engine(EngineConfig(model=str(tiny_model), device="cpu")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        with trio.fail_after(120):
            alone, _ = await _run(client, healthy, params)
            marked = set(await client.tokenize(poisoned)) - set(await client.tokenize(healthy))
            assert marked
            calls = {"n": 0}

            def poison(prompt_ids: list[int], row: np.ndarray) -> np.ndarray:
                if marked.isdisjoint(prompt_ids):
                    return row
                calls["n"] += 1
                return row if calls["n"] < 3 else np.full_like(row, np.nan)  # fails on its third token

            engine.actors["sampler"].poison = poison
            results = {}

            async def one(prompt: str) -> None:
                results[prompt] = await _run(client, prompt, params)

            async with trio.open_nursery() as n:
                n.start_soon(one, poisoned)
                n.start_soon(one, healthy)
            bad_ids, bad_events = results[poisoned]
            assert isinstance(bad_events[-1], Failed), bad_events[-1]
            assert "not finite" in bad_events[-1].message and len(bad_ids) == 2
            good_ids, good_events = results[healthy]
            assert isinstance(good_events[-1], Finished) and good_ids == alone
            again, events = await _run(client, healthy, params)  # the engine serves on
            assert isinstance(events[-1], Finished) and again == alone
            while (await client.stats()).kv_used_blocks:  # the failed request's blocks were freed
                await trio.sleep(0.05)
        engine.actors["kv"].allocator.check_invariants()
        left = engine.actors["sampler"].samplers.values()  # drops of finished ones ride the next round
        assert all(marked.isdisjoint(s.prompt_ids) for s in left), "the failed request's sampler state was kept"
