"""A greedy answer does not depend on what shares its rounds, nor on whether its tokens were decoded
or prefilled (slow tier, real models on the default device: cpu-fast's int8 kernels, and AMX tiles
where the CPU has them).

The same prompts asked one at a time, all at once (batched decode rounds, prefills beside
decodes) and again after the prefix cache holds them (a prefill of a few rows instead of
the whole prompt) give the same tokens: every int8 path applies the block scales in one
float order (tests/int8_canonical.py), and decode's paged attention computes a row as prefill's
chunk attention does (the same GEMM kernel for the scores, the same softmax, an fma chain over the
keys), so no path choice can move a near-tie.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio

from conftest import _model
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams

SYSTEM = ("You are a careful assistant for a team of Python developers. Answer briefly, "
          "with code where it helps, and say so when you are unsure.")  # shared: prefix-cache hits
QUESTIONS = [
    "Write a function that reverses a string.",
    "What does the walrus operator do?",
    "How do I read a JSON file into a dict?",
    "Explain list comprehensions in one sentence.",
    "Write a function that checks whether a number is prime.",
    "What is the difference between a tuple and a list?",
    "How do I sort a list of dicts by a key?",
    "Name three uses of the itertools module.",
]
MAX_TOKENS = 24


@pytest.mark.slow
def test_greedy_answers_are_the_same_alone_batched_and_from_the_prefix_cache():
    config = EngineConfig(model=str(_model("qwen2.5-coder-0.5b")), max_running=8)

    async def ask(client: AsyncClient, question: str, into: dict[str, list[int]]) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        ids: list[int] = []
        async for ev in client.generate(messages=messages, params=SamplingParams(temperature=0.0,
                                                                                 max_tokens=MAX_TOKENS)):
            ids += ev.token_ids if isinstance(ev, Delta) else []
            end = ev
        assert isinstance(end, Finished)
        into[question] = ids

    async def run(engine: EngineThread) -> None:
        async with AsyncClient(engine.ctx, engine.address) as client:
            alone: dict[str, list[int]] = {}
            for q in QUESTIONS:  # one at a time; from the second on, the system prompt is a cache hit
                await ask(client, q, alone)
            batched: dict[str, list[int]] = {}
            async with trio.open_nursery() as nursery:  # all at once, every prompt now cached
                for q in QUESTIONS:
                    nursery.start_soon(ask, client, q, batched)
            differ = [q for q in QUESTIONS if batched[q] != alone[q]]
            assert not differ, f"{len(differ)} of {len(QUESTIONS)} answers changed with their batch: {differ}"

    with EngineThread(config) as engine:
        trio.run(run, engine)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "gemma3-270m"])
def test_a_token_decoded_and_the_same_token_prefilled_get_the_same_logits(model):
    """Decode rounds (paged attention, the int8 row kernels) and one prefill of the same tokens
    (chunk attention, the tiles or outer products) give bit-identical logits at every position:
    a stream continued elsewhere from its tokens goes on exactly as it would have."""
    from test_greedy_goldens import greedy, teacher_forced
    from zinfer.devices.registry import make_device
    from zinfer.models.loader import open_model
    from zinfer.models.weights import build_weights

    source = open_model(_model(model))
    dev = make_device("cpu-fast", None)
    weights = build_weights(source.spec, source.tensors, dev.upload)
    prompt = list(range(200, 240))  # 40 rows: a long chunk (LONG_CHUNK 32) on the tiles or outer products
    ids, decoded = greedy(source, weights, dev, prompt, 8, frozenset())
    prefilled = teacher_forced(source, weights, dev, prompt + ids[:-1])[len(prompt) - 1 :]
    np.testing.assert_array_equal(np.stack(decoded), prefilled)
