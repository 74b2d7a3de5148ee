"""llama-server's /infill on Qwen2.5-Coder-0.5B over the ten code holes of
tests/benchmarks/infill_holes.json (function bodies, call arguments, closing blocks,
conditions): greedy middles, spliced in, make the file compile and its test pass, and each
middle ends at the hole's end (stop_at_suffix) or by itself, never at n_predict.

Issue #37 asks for 8 of the 10. Measured (tests/benchmarks/bench_infill.py, BENCHMARKS.md):
8 on the oracle, on cpu-fast and on llama.cpp's texts under the same stop rule, the misses
being wrong middles rather than middles that run on (the 0.5B instruct model's palindrome
ignores punctuation, its sort key is `Employee.salary`); with earlier int8 kernels cpu-fast
also got `chunks` wrong (7): its greedy token there differed from the float32 oracle's. llama.cpp's
plain FIM stops at none of the holes' ends (3 of 10)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import _model
from http_server import running_server, sse_events
from infill_holes import holes, judge

pytestmark = pytest.mark.slow
N_PREDICT = 96  # the longest reference middle is 40 tokens


@pytest.fixture(scope="module")
def server():
    with running_server(_model("qwen2.5-coder-0.5b"), "--device", "cpu-fast") as s:
        yield s


def test_ten_code_holes_filled_so_the_file_compiles_and_its_test_passes(server):
    passed, report = 0, []
    for hole in holes():
        r = httpx.post(server.url + "/infill", timeout=300, json={
            "input_prefix": hole.prefix, "input_suffix": hole.suffix, "n_predict": N_PREDICT, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        verdict = judge(hole, body["content"])
        passed += verdict is None
        report.append(f"{hole.name}: {verdict or 'pass'} ({body['stop_type']}) {body['content']!r}")
        assert body["stop_type"] in ("word", "eos"), report[-1]  # it stopped at the hole's end
    assert passed >= 8, "\n".join(report)


def test_a_streamed_middle_is_the_whole_one_and_says_where_it_stopped(server):
    hole = next(h for h in holes() if h.name == "binary_search_condition")
    body = {"input_prefix": hole.prefix, "input_suffix": hole.suffix, "n_predict": 24, "temperature": 0}
    whole = httpx.post(server.url + "/infill", json=body, timeout=300).json()
    with httpx.stream("POST", server.url + "/infill", json={**body, "stream": True}, timeout=300) as s:
        chunks = [json.loads(e) for e in sse_events(s.iter_lines())]
    assert "".join(c["content"] for c in chunks) == whole["content"] == "lo <= hi"
    assert chunks[-1]["stop"] and chunks[-1]["stop_type"] == "word" and chunks[-1]["stopping_word"] == ":"
