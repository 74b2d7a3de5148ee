"""The grammar fuzz target (tests/fuzz_grammars.py) in the slow tier: deep, wide, recursive,
exploding and empty-language grammars of every kind never make an undocumented 5xx, kill
or stall the server, or leave it holding anything. `python3 tests/fuzz_grammars.py
--minutes 10` runs the same target for longer."""

from __future__ import annotations

from collections import Counter

import pytest
from fuzz_grammars import FUZZ, HEALTH_LIMIT, HealthPoller, grammar_case, grammars
from fuzz_surfaces import ServerUnderTest
from hostile_grammars import EMPTY_LANGUAGES, lark_chain, ref_chain_schema
from hypothesis import Phase, example, given, settings
from tiny import write_tiny_gguf


@pytest.fixture(scope="module")
def sut(tmp_path_factory):
    s = ServerUnderTest(write_tiny_gguf(tmp_path_factory.mktemp("fuzzg") / "tiny-llama.gguf", "llama", seed=5),
                        "--max-running", "8", timeout=30.0)
    yield s
    s.close()


@pytest.fixture(scope="module")
def poller(sut):
    p = HealthPoller(sut.ensure_alive().url)
    yield p
    p.close()


@pytest.mark.slow  # 60 grammars: ~20-40 s
@settings(max_examples=60, phases=[Phase.explicit, Phase.generate, Phase.shrink], **FUZZ)
@given(grammar=grammars)
@example(grammar=("json_schema", ref_chain_schema(1500)))  # found: signal 11 in llguidance
@example(grammar=("lark", lark_chain(3000)))  # found: signal 11
@example(grammar=EMPTY_LANGUAGES[0])  # found: 500 with the parser's state
@example(grammar=("regex", "(x{1000}){1000}"))  # found: 1.2 s stall, then 500
def test_no_grammar_crashes_stalls_or_5xxs(sut, poller, grammar):
    sut.ensure_alive()
    sut.run_case(grammar_case, sut, *grammar, Counter(), case=grammar)
    worst = poller.worst()
    assert worst < HEALTH_LIMIT, f"/health took {worst:.2f} s during {str(grammar)[:300]!r}"

