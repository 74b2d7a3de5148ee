"""Hostile grammars (issue 32, cases 1-3): a grammar that would overflow llguidance's native
stack, freeze the event loop or fail in the sampler is refused with a 400 (or the
protocol's rejection) in our own words, on every transport, and the server serves on.

Before grammars were measured and compiled in the grammar worker, a 1,500-`$ref` schema
ended `serve` with signal 11, a 2,000-rule GBNF froze every client for 2.6 s, and the
empty languages below got HTTP 500 with llguidance's parser state in the message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import trio
from hostile_grammars import EMPTY_LANGUAGES, PARSER_INTERNALS, gbnf_chain, lark_chain, ref_chain_schema
from http_server import running_server
from tiny import write_tiny_gguf
from websockets.sync.client import connect

from zinfer.actors.grammar_checker import GrammarChecker
from zinfer.actors.grammar_limits import MAX_CHAIN, check_limits, longest_chain, repetition_product
from zinfer.gateway.client import Client
from zinfer.messages.client import Finished, Rejected
from zinfer.messages.params import Constraint, SamplingParams

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("hostile") / "tiny-llama.gguf", "llama", seed=3)


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, "--max-running", "8") as s:
        yield s


def assert_alive(server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


def assert_our_words(message: str) -> None:
    assert not any(w in message for w in PARSER_INTERNALS), message


# ---- the measurements ------------------------------------------------------------------------


def test_chains_past_the_limit_are_refused_before_any_library_sees_them():
    with pytest.raises(ValueError, match=r"\$refs 3002 deep"):
        check_limits(Constraint("json_schema", ref_chain_schema(1500)))
    with pytest.raises(ValueError, match="3002 rules"):
        check_limits(Constraint("lark", lark_chain(3000)))
    with pytest.raises(ValueError, match="chains rule references"):
        check_limits(Constraint("lark", lark_chain(MAX_CHAIN)))
    with pytest.raises(ValueError, match="2002 rules"):
        check_limits(Constraint("gbnf", gbnf_chain(2000)))
    with pytest.raises(ValueError, match="repeats more than"):
        check_limits(Constraint("regex", "(x{1000}){1000}"))
    with pytest.raises(ValueError, match="repeats more than"):
        check_limits(Constraint("lark", 'start: ("x" ~ 100..1000) ~ 1000'))
    with pytest.raises(ValueError, match="nests too deeply"):
        check_limits(Constraint("json_schema", "[" * 100_000 + "]" * 100_000))


def test_ordinary_grammars_pass_the_measurements():
    tree = {"$defs": {"node": {"type": "object",
                               "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    check_limits(Constraint("json_schema", json.dumps(tree)))  # recursion is fine: a cycle is compiled once
    check_limits(Constraint("json_schema", ref_chain_schema(40)))
    check_limits(Constraint("lark", lark_chain(100)))
    check_limits(Constraint("regex", r"[A-Z][a-z]{2,6} costs [0-9]{1,3}(\.[0-9]{2})? \p{L}{1,20}"))
    assert repetition_product(r"(a{10}|b){20}[{]{99}\{5}") == 200


def test_the_chain_bound_covers_every_compile_order():
    # a cycle counts whole, then the longest chain after it
    assert longest_chain({"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}) == 4
    assert longest_chain({"r": ["a", "b"], "a": ["b"], "b": ["c"], "c": []}) == 4
    assert longest_chain({i: [i + 1] for i in range(100_000)}) == 100_001  # iterative: no RecursionError


# ---- the grammar worker --------------------------------------------------------------------


def check_all(model, constraints, check_seconds=5.0):
    """Each constraint's outcome from one GrammarChecker: the admitted Constraint or the refusal."""

    async def main():
        checker = GrammarChecker(str(model), check_seconds)
        out = []
        try:
            for c in constraints:
                try:
                    out.append(await checker.check(c))
                except ValueError as exc:
                    out.append(str(exc))
        finally:
            await checker.aclose()
        return out

    return trio.run(main)


def test_empty_languages_are_refused_with_the_vocabulary_in_our_words(tiny_model):
    out = check_all(tiny_model, [Constraint(k, s) for k, s in EMPTY_LANGUAGES]
                    + [Constraint("gbnf", 'root ::= "a" | "b"')])
    for (kind, _), verdict in zip(EMPTY_LANGUAGES, out):
        assert isinstance(verdict, str) and "allows no output" in verdict, (kind, verdict)
        assert_our_words(verdict)
    assert out[-1].kind == "lark" and '"a"' in out[-1].spec  # GBNF comes back converted


def test_a_worker_that_overruns_is_replaced(tiny_model):
    ok = Constraint("regex", "[a-z]{3}")
    out = check_all(tiny_model, [Constraint("regex", "(x{100}){100}"), ok], check_seconds=1e-4)
    assert "took longer than" in out[0]
    assert "took longer than" in out[1] or out[1] == ok  # a new worker: the first check waited out its start


def test_a_worker_that_dies_mid_check_is_replaced(tiny_model):
    """The worker stopped, then killed while it holds a grammar (as a native crash would end
    it): that request is refused in our words, and the next check gets a new worker."""

    async def main():
        checker = GrammarChecker(str(tiny_model))
        try:
            assert await checker.check(Constraint("regex", "a+")) == Constraint("regex", "a+")
            pid = checker._proc.pid
            os.kill(pid, signal.SIGSTOP)
            async with trio.open_nursery() as n:
                n.start_soon(refused, checker)
                await trio.sleep(0.3)  # the grammar is in the stopped worker's pipe
                os.kill(pid, signal.SIGKILL)
            assert await checker.check(Constraint("regex", "c+")) == Constraint("regex", "c+")
            assert checker._proc.pid != pid
        finally:
            await checker.aclose()

    async def refused(checker):
        with pytest.raises(ValueError, match="too complex to compile"):
            await checker.check(Constraint("regex", "b+"))

    trio.run(main)


# ---- every transport -------------------------------------------------------------------------


def post(server, body, timeout=30):
    return httpx.post(server.url + "/v1/chat/completions",
                      json={"model": server.model, "messages": HI, "max_tokens": 4, **body}, timeout=timeout)


def test_a_ref_chain_that_crashed_serve_is_a_400(server):
    schema = json.loads(ref_chain_schema(1500))
    r = post(server, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format" and "$refs 3002 deep" in err["message"], err
    r = post(server, {"grammar": lark_chain(3000)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar", r.text
    assert_alive(server)


@pytest.mark.parametrize("kind,spec", EMPTY_LANGUAGES, ids=[k for k, _ in EMPTY_LANGUAGES])
def test_an_empty_language_is_a_400_not_a_500(server, kind, spec):
    field = {"json_schema": "guided_json", "regex": "guided_regex", "lark": "guided_grammar", "gbnf": "grammar"}[kind]
    r = post(server, {field: spec})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "allows no output" in err["message"], err
    assert_our_words(err["message"])


def test_a_grammar_that_dies_mid_output_is_a_400_naming_the_field(server):
    """`b` can never complete: the first token ("a") is allowed, then nothing is. Found by the
    grammar fuzz target as a 500 with the parser's words."""
    r = post(server, {"guided_grammar": 'start: "a" b\nb: b', "max_tokens": 8})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "guided_grammar" and "allows nothing after the 1 tokens generated" in err["message"], err
    assert_our_words(err["message"])
    assert_alive(server)


def test_huge_and_many_rule_grammars_never_freeze_other_clients(server):
    """A 3.96 MB GBNF grammar of 116,000 rules (under the 4 MiB body limit) and a 2,000-rule one, while
    another client polls /health: every poll answers within 0.5 s."""
    slowest, stop = [0.0], threading.Event()

    def poll():
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.get(server.url + "/health")
                slowest[0] = max(slowest[0], time.perf_counter() - t)
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        huge = gbnf_chain(116_000, "rule_nr_x")
        assert 3.95e6 < len(huge) < 4e6
        for grammar, words in ((huge, "larger than"), (gbnf_chain(2000), "2002 rules")):
            r = post(server, {"grammar": grammar}, timeout=60)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text[:500]
        r = post(server, {"guided_regex": "(x{1000}){1000}"})
        assert r.status_code == 400 and "repeats more than" in r.json()["error"]["message"], r.text
    finally:
        stop.set()
        poller.join()
    assert slowest[0] < 0.5, f"/health took {slowest[0]:.2f} s"


def test_the_websocket_refuses_the_crashing_schema(server):
    with connect(server.ws, open_timeout=30) as ws:
        params = {"max_tokens": 4, "constraint": {"kind": "json_schema", "spec": ref_chain_schema(1500)}}
        ws.send(json.dumps({"type": "generate", "id": "g1", "messages": HI, "params": params}))
        ws.send(json.dumps({"type": "generate", "id": "g2", "messages": HI,
                            "params": {"max_tokens": 3, "temperature": 0}}))
        got = {}
        while len(got) < 2:
            m = json.loads(ws.recv(timeout=60))
            if m["type"] in ("done", "error", "cancelled"):
                got[m["id"]] = m
    assert got["g1"]["type"] == "error" and "$refs 3002 deep" in got["g1"]["message"], got
    assert got["g2"]["type"] == "done", got
    assert_alive(server)


def test_zeromq_refuses_the_crashing_schema_and_serves_on(server):
    bad = SamplingParams(max_tokens=4, constraint=Constraint("json_schema", ref_chain_schema(1500)))
    with Client(server.zmq, timeout_s=60) as c:
        events = list(c.generate("hello", params=bad))
        assert isinstance(events[-1], Rejected) and events[-1].code == "bad_constraint", events[-1]
        assert "$refs 3002 deep" in events[-1].message
        assert isinstance(list(c.generate("hello", params=SamplingParams(max_tokens=2)))[-1], Finished)


def test_stdio_refuses_the_crashing_schema_and_finishes_the_other_request(tiny_model):
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", str(tiny_model)]
    lines = [
        {"type": "generate", "request_id": "ok", "prompt": "x", "params": {"max_tokens": 6, "seed": 1}},
        {"type": "generate", "request_id": "bad", "prompt": "x",
         "params": {"constraint": {"kind": "lark", "spec": lark_chain(3000)}}},
    ]
    r = subprocess.run(cmd, input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    events = [json.loads(line) for line in r.stdout.splitlines()]
    terminal = {e["request_id"]: e for e in events if e["type"] in ("finished", "rejected", "failed", "cancelled")}
    assert terminal["bad"]["type"] == "rejected" and terminal["bad"]["code"] == "bad_constraint", terminal
    assert terminal["ok"]["type"] == "finished", terminal


def test_every_refusal_left_the_server_idle(server):
    m = server.wait_idle()
    assert m["zinfer_kv_used_blocks"] == 0 and m["zinfer_running_sequences"] == 0
