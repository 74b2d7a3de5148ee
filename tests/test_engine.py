"""The actor engine end to end: batching, prefix cache, stops, rejections, cancels (the soak: tests/test_soak.py).

Every test runs on a tiny random llama (fast tier) and on the real SmolLM2 (slow tier)."""

from __future__ import annotations


import pytest
import trio

from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import TERMINAL_EVENTS, Delta, Finished, Rejected, Started
from zinfer.messages.params import SamplingParams
from tiny import write_tiny_gguf

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite fruit is",
    "In 1969, the first man on the moon",
    "The quick brown fox",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def engine(request, tmp_path_factory):
    if request.param == "tiny":  # a context of 4096 like SmolLM2's (capped), so the same prompts fit or not
        path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=4096)
    else:
        path = request.getfixturevalue("smollm2_path")
    with EngineThread(EngineConfig(model=str(path), device="cpu", max_running=32, num_blocks=1024)) as e:
        yield e


async def collect(client: AsyncClient, prompt, params=GREEDY, **kw) -> tuple[list[int], object, list]:
    """Run one request; return (token ids, terminal event, all events)."""
    ids, events = [], []
    async for ev in client.generate(prompt, params=params, **kw):
        events.append(ev)
        if isinstance(ev, Delta):
            ids += ev.token_ids
    return ids, events[-1], events


async def wait_idle(client: AsyncClient) -> object:
    """Engine stats once no request is open and no KV block is held by a sequence."""
    with trio.fail_after(30):
        while True:
            stats = await client.stats()
            if stats.open_requests == 0 and stats.running == 0 and stats.kv_used_blocks == 0:
                return stats
            await trio.sleep(0.05)


async def test_concurrent_greedy_equals_single(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        single = {}
        for p in PROMPTS:
            single[p], _, _ = await collect(client, p)
        results = {}

        async def one(i: int) -> None:
            p = PROMPTS[i % len(PROMPTS)]
            results[i], terminal, _ = await collect(client, p)
            assert isinstance(terminal, Finished)

        async with trio.open_nursery() as n:
            for i in range(32):
                n.start_soon(one, i)
        differ = [i for i in range(32) if results[i] != single[PROMPTS[i % len(PROMPTS)]]]
        assert not differ, f"batched outputs {differ} differ from the single-request output"
        await wait_idle(client)


async def test_every_request_one_terminal_event_with_usage(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        ids, terminal, events = await collect(client, "Hello", SamplingParams(temperature=0, max_tokens=5))
        assert isinstance(events[0], Started)
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1
        assert terminal.finish_reasons == ["length"]
        assert terminal.usage.completion_tokens == 5 == len(ids)
        assert terminal.usage.prompt_tokens == events[0].prompt_tokens


async def test_prefix_cache_skips_shared_prefill(engine):
    """A prompt seen before is served from the prefix cache (usage.cached_tokens: all its
    whole blocks) and answers as it did cold; one sharing only a prefix reuses the
    prefix's blocks; one that starts differently reuses nothing."""
    prefix = " ".join(f"item{i}" for i in range(240))  # >= 480 tokens
    params = SamplingParams(temperature=0, max_tokens=4)
    async with AsyncClient(engine.ctx, engine.address) as client:
        await wait_idle(client)
        cold_ids, cold, _ = await collect(client, prefix + " first question?", params)
        warm_ids, warm, _ = await collect(client, prefix + " first question?", params)
        _, shared, _ = await collect(client, prefix + " second question?", params)
        _, other, _ = await collect(client, "other " + prefix, params)
        assert isinstance(cold, Finished) and isinstance(warm, Finished)
        assert cold.usage.prompt_tokens > 256 and cold.usage.cached_tokens == 0
        block = 16  # EngineConfig.block_size: only whole blocks are cached, the last token is always computed
        assert warm.usage.prompt_tokens - block <= warm.usage.cached_tokens < warm.usage.prompt_tokens, warm.usage
        assert warm_ids == cold_ids
        assert shared.usage.cached_tokens >= shared.usage.prompt_tokens - 32, shared.usage
        assert other.usage.cached_tokens == 0, other.usage


async def test_stop_string_and_stop_token(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        full, _, events = await collect(client, "The capital of France is",
                                        SamplingParams(temperature=0, max_tokens=12))
        text = "".join(e.text for e in events if isinstance(e, Delta))
        stop = text[len(text) // 2 :][:2]  # two characters from the middle of the greedy answer
        assert stop.strip(), text
        _, terminal, events = await collect(client, "The capital of France is",
                                            SamplingParams(temperature=0, max_tokens=12, stop=[stop]))
        cut = "".join(e.text for e in events if isinstance(e, Delta))
        assert stop not in cut and text.startswith(cut)
        assert terminal.finish_reasons == ["stop"]
        ids, terminal, _ = await collect(client, "The capital of France is",
                                         SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[full[2]]))
        assert ids == full[:3] and terminal.finish_reasons == ["stop"]


async def test_bad_requests_are_rejected_and_engine_lives(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        # one word is a token or more
        _, terminal, _ = await collect(client, "word " * (engine.engine.max_model_len + 100))
        assert isinstance(terminal, Rejected) and terminal.code == "too_long"
        assert terminal.n_prompt_tokens > terminal.n_ctx
        _, terminal, _ = await collect(client, "hi", SamplingParams(temperature=-1))
        assert isinstance(terminal, Rejected) and "temperature" in terminal.message
        _, terminal, _ = await collect(client, None, prompt_ids=[10**9])
        assert isinstance(terminal, Rejected) and "vocabulary" in terminal.message
        ids, terminal, _ = await collect(client, "Still alive?")
        assert isinstance(terminal, Finished) and ids


async def test_client_cancel_frees_blocks(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        events = []
        async for ev in client.generate("Tell me a long story.", params=SamplingParams(max_tokens=200)):
            events.append(ev)
            if isinstance(ev, Delta):
                break  # leaving the loop cancels the request
        stats = await wait_idle(client)
        assert stats.kv_used_blocks == 0
