"""A constraint's prefix_ids (messages/params.py): the grammar advances over tokens the output
already begins with, so a stream continued on another engine (gateway/router_stream.py) goes on
from the grammar state after the tokens it had streamed. Tiny random-weight model, numpy device."""

from __future__ import annotations

import re

import pytest
import trio
from tiny import write_tiny_gguf

from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import ClientEvent, Delta, Finished, Rejected
from zinfer.messages.params import Constraint, SamplingParams

WORDS = Constraint("regex", "[a-z]{6}( [a-z]{6}){3}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("prefix") / "tiny-llama.gguf", "llama", seed=3)
    with EngineThread(EngineConfig(model=str(model), device="cpu", max_running=4)) as e:
        yield e


def run(engine, *calls: dict) -> list[list[ClientEvent]]:
    async def main() -> list[list[ClientEvent]]:
        async with AsyncClient(engine.ctx, engine.address) as client:
            return [[ev async for ev in client.generate(**call)] for call in calls]

    return trio.run(main)


def test_a_continuation_with_the_sent_ids_as_prefix_goes_on_as_the_whole_run_did(engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=40, constraint=WORDS)
    (whole,) = run(engine, dict(prompt="hello", params=greedy))
    assert isinstance(whole[-1], Finished), whole[-1]
    ids = [t for e in whole if isinstance(e, Delta) for t in e.token_ids]
    text = "".join(e.text for e in whole if isinstance(e, Delta))
    assert re.fullmatch(WORDS.spec, text), text
    k = len(ids) // 2
    prefix = Constraint(WORDS.kind, WORDS.spec, ids[:k])
    rest = SamplingParams(temperature=0.0, max_tokens=40 - k, constraint=prefix)
    (cont,) = run(engine, dict(prompt_ids=whole[-1].prompt_ids + ids[:k], add_special=False, params=rest))
    assert isinstance(cont[-1], Finished), cont[-1]
    assert [t for e in cont if isinstance(e, Delta) for t in e.token_ids] == ids[k:]  # not a fresh start: ends it


def test_a_prefix_the_grammar_does_not_allow_is_refused_naming_the_id(engine):
    digit = 2 + ord("7")  # the tiny vocabulary's ids are 2 + byte
    bad = SamplingParams(temperature=0.0, max_tokens=8, constraint=Constraint(WORDS.kind, WORDS.spec, [digit]))
    huge = SamplingParams(max_tokens=8, constraint=Constraint(WORDS.kind, WORDS.spec, [5] * 100_000))
    refused, too_long = run(engine, dict(prompt="hello", params=bad), dict(prompt="hello", params=huge))
    assert [type(e) for e in refused] == [Rejected] and refused[0].code == "bad_constraint"
    assert "prefix_ids[0]" in refused[0].message and str(digit) in refused[0].message
    assert [type(e) for e in too_long] == [Rejected] and "prefix_ids" in too_long[0].message
