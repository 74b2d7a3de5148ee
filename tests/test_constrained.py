"""Constrained decoding (issue #17): response_format, vLLM's guided_* / structured_outputs and
llama-server's json_schema / grammar make the output match, on a tiny random-weight model
whose free output never would; bad constraints are refused before any work is queued.

The slow tier on real models (the official openai client's parse(), varied schemas at
temperature 0.8) is tests/test_constrained_real.py; tests/benchmarks/schema_acceptance.py runs 50.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import openai
import pytest
import trio
from http_server import running_server
from tiny import write_tiny_gguf

from zinfer.actors.constraints import NUMBER_LIMIT, bounded_numbers, compile_grammar
from zinfer.actors.grammar_vocab import grammar_tokenizer
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished, Rejected
from zinfer.messages.params import Constraint, SamplingParams
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder

PRICE = r"[A-Z][a-z]{2,6} costs [0-9]{1,3}(\.[0-9]{2})? (EUR|USD)"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"enum": ["ada", "bob", "cy"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["name", "age", "member", "tags"],
    "additionalProperties": False,
}
HI = [{"role": "user", "content": "Hi"}]


def check_person(text: str) -> None:
    """text is one JSON object that PERSON admits (checked by hand: no jsonschema here)."""
    obj = json.loads(text)
    assert set(obj) == {"name", "age", "member", "tags"}
    assert obj["name"] in ("ada", "bob", "cy")
    assert type(obj["age"]) is int and 0 <= obj["age"] <= 120
    assert type(obj["member"]) is bool
    assert isinstance(obj["tags"], list) and len(obj["tags"]) <= 3 and set(obj["tags"]) <= {"x", "y"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("constrained") / "tiny-llama.gguf", "llama", seed=3)


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, "--max-running", "8") as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def engine(tiny_model):
    with EngineThread(EngineConfig(model=str(tiny_model), max_running=8)) as e:
        yield e


# ---- the vocabulary as llguidance reads it --------------------------------------------------


def test_llguidance_reads_the_tiny_vocabulary_with_the_eos_the_scheduler_stops_on(tiny_model):
    source = open_model(tiny_model)
    ll = grammar_tokenizer(source)
    assert ll.vocab_size == source.spec.vocab_size
    assert set(ll.eos_tokens) == set(PromptBuilder.from_source(source).tokenizer.eos_ids)


# ---- output that matches ---------------------------------------------------------------------


def test_a_regex_forces_matching_output_from_random_weights(oai, server):
    free = oai.completions.create(model=server.model, prompt="The price:", max_tokens=24, seed=1)
    assert not re.fullmatch(PRICE, free.choices[0].text)  # what random weights say unconstrained
    for seed in range(6):
        r = oai.completions.create(model=server.model, prompt="The price:", max_tokens=64, seed=seed,
                                   extra_body={"guided_regex": PRICE})
        assert re.fullmatch(PRICE, r.choices[0].text), r.choices[0].text
        assert r.choices[0].finish_reason == "stop"


def test_structured_outputs_regex_and_a_streamed_chat(oai, server):
    stream = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=64, seed=4, stream=True,
                                         extra_body={"structured_outputs": {"regex": PRICE}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert re.fullmatch(PRICE, text), text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_choice_picks_one_of_the_choices_for_every_n(oai, server):
    choices = ["red", "green", "blue"]
    r = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=16, n=4, seed=2,
                                    extra_body={"guided_choice": choices})
    assert len(r.choices) == 4
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in r.choices)


def test_a_gbnf_grammar_from_llama_server_clients(server):
    r = httpx.post(server.url + "/v1/completions",
                   json={"model": server.model, "prompt": "Answer:", "max_tokens": 16, "seed": 3,
                         "grammar": 'root ::= ("yes" | "no") "!"'}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes!", "no!")


@pytest.mark.parametrize("field", ["response_format", "guided_json", "json_schema", "structured_outputs"])
def test_a_json_schema_yields_json_it_admits(oai, server, field):
    body = {
        "response_format": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "person", "schema": PERSON, "strict": True}}},
        "guided_json": {"guided_json": json.dumps(PERSON)},
        "json_schema": {"json_schema": PERSON},
        "structured_outputs": {"structured_outputs": {"json": PERSON}},
    }[field]
    for seed in range(3):
        r = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=200, seed=seed, extra_body=body)
        assert r.choices[0].finish_reason == "stop"
        check_person(r.choices[0].message.content)


def test_strict_closes_every_object_a_schema_leaves_open(oai, server):
    open_schema = {"type": "object",
                   "properties": {"a": {"enum": ["x"]},
                                  "b": {"type": "object", "properties": {"c": {"type": "boolean"}}, "required": ["c"]}},
                   "required": ["a", "b"]}
    for seed in range(3):
        strict = {"type": "json_schema", "json_schema": {"name": "o", "schema": open_schema, "strict": True}}
        r = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=60, seed=seed,
                                        response_format=strict)
        out = json.loads(r.choices[0].message.content)
        assert set(out) == {"a", "b"} and set(out["b"]) == {"c"}, out  # no invented keys


def test_json_object_starts_an_object_and_text_is_free(oai, server):
    r = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=48, seed=5,
                                    response_format={"type": "json_object"})
    out = r.choices[0].message.content
    assert out.startswith("{")
    if r.choices[0].finish_reason == "stop":  # random weights may well run to the length limit inside the object
        assert isinstance(json.loads(out), dict)
    free = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=24, seed=5,
                                       response_format={"type": "text"})
    assert free.choices[0].finish_reason == "length"  # no constraint: random weights never stop at 24


DIGITS = {str(2 + ord(d)): 100 for d in "123456789"}  # the tiny vocabulary's byte tokens for digits, favoured


def test_a_number_the_schema_leaves_unbounded_still_ends(oai, server):
    """A model that keeps writing digits (here: told to by logit_bias) meets the end of a
    15-digit integer, not max_tokens: an unbounded integer or number has at most 15 digits
    before the point. A bounded one keeps its bounds."""
    schema = {"type": "object",
              "properties": {"n": {"type": "integer"}, "m": {"type": "integer", "minimum": 3, "maximum": 7}},
              "required": ["n", "m"], "additionalProperties": False}
    r = oai.chat.completions.create(model=server.model, messages=HI, max_tokens=64, seed=1, logit_bias=DIGITS,
                                    extra_body={"guided_json": schema})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    out = json.loads(r.choices[0].message.content)
    assert len(str(out["n"])) == 15 and 3 <= out["m"] <= 7, out
    r = oai.completions.create(model=server.model, prompt="x", max_tokens=64, seed=1, logit_bias=DIGITS,
                               extra_body={"guided_json": {"type": "number", "minimum": 0}})
    assert len(r.choices[0].text.split(".")[0]) == 15, r.choices[0].text  # digits after the point are not bounded


def test_bounded_numbers_keeps_what_a_schema_bounds():
    schema = {"type": "object", "properties": {
        "a": {"type": "integer", "exclusiveMinimum": 0}, "b": {"type": ["number", "null"], "maximum": 2.5},
        "c": {"type": "number", "minimum": 1e20}, "d": {"type": "integer", "minimum": 1, "maximum": 9},
    }}
    out = bounded_numbers(schema)
    assert out["properties"]["a"] == {"type": "integer", "exclusiveMinimum": 0, "maximum": NUMBER_LIMIT}
    assert out["properties"]["b"] == {"type": ["number", "null"], "maximum": 2.5, "minimum": -NUMBER_LIMIT}
    assert out["properties"]["c"] == {"type": "number", "minimum": 1e20}  # above the limit: left open above
    # schema itself untouched
    assert out["properties"]["d"] == schema["properties"]["d"] and "minimum" not in schema["properties"]["a"]


# ---- refusals before any work ----------------------------------------------------------------

BAD = [
    ({"response_format": {"type": "sound"}}, "response_format", "text, json_object, json_schema"),
    ({"response_format": "json"}, "response_format", "object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}},
     "response_format", "Unimplemented"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_json": [1, 2]}, "guided_json", "schema"),
    ({"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
    ({"guided_regex": ""}, "guided_regex", "non-empty"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["a", 5]}, "guided_choice", "strings"),
    ({"guided_grammar": "start: foo"}, "guided_grammar", "unknown name"),
    ({"grammar": "root ::= undefined-rule"}, "grammar", "not found"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "one of"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs", "not supported"),
    ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex", "at most one"),
    ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "grammar", "at most one"),
]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("extra,param,words", BAD, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD)])
def test_a_bad_constraint_is_a_400_naming_its_field(server, route, extra, param, words):
    form = {"messages": HI} if route == "/v1/chat/completions" else {"prompt": "x"}
    r = httpx.post(server.url + route, json={"model": server.model, **form, "max_tokens": 4, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_the_openai_client_sees_the_400(oai, server):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model=server.model, messages=HI, max_tokens=4, response_format={"type": "sound"})
    assert exc.value.body["param"] == "response_format"


def test_every_refusal_left_the_server_idle(server):
    m = server.wait_idle()
    assert m["zinfer_kv_used_blocks"] == 0 and m["zinfer_running_sequences"] == 0


# ---- the engine: batching with free requests, failures of one request alone -----------------


def test_constrained_and_free_requests_share_rounds_and_both_finish(engine):
    sampler = engine.engine.actors["sampler"]
    rounds: list[dict[int, bool]] = []  # per round: seq_id -> constrained
    sample_round = sampler.sample_round

    def recording(msg, *grammars):
        out = sample_round(msg, *grammars)
        rounds.append({s: sampler.samplers[s].grammar is not None for s in msg.seq_ids if s in sampler.samplers})
        return out

    sampler.sample_round = recording
    try:
        texts = trio.run(run_pair, engine)
    finally:
        del sampler.sample_round
    assert re.fullmatch(r"[a-z]{24}", texts["constrained"][0]) and texts["constrained"][1] == "stop"
    assert texts["free"][1] == "length"
    assert any(True in r.values() and False in r.values() for r in rounds), "no round carried both"


async def run_pair(engine) -> dict[str, tuple[str, str]]:
    out = {}

    async def one(name: str, params: SamplingParams) -> None:
        text, last = "", None
        async with AsyncClient(engine.ctx, engine.address) as client:
            async for ev in client.generate("hello", params=params):
                last = ev
                if isinstance(ev, Delta):
                    text += ev.text
        assert isinstance(last, Finished), last
        out[name] = (text, last.finish_reasons[0])

    constrained = SamplingParams(max_tokens=40, seed=1, constraint=Constraint("regex", "[a-z]{24}"))
    await one("warm-up", constrained)  # the front door's grammar worker starts (~1 s) and keeps its verdict
    async with trio.open_nursery() as n:
        n.start_soon(one, "constrained", constrained)
        n.start_soon(one, "free", SamplingParams(max_tokens=30, seed=1))
    return out


def test_a_bad_constraint_over_zeromq_is_refused_alone(engine):
    async def main():
        async with AsyncClient(engine.ctx, engine.address) as client:
            results = {}

            async def one(name, params):
                results[name] = [ev async for ev in client.generate("hello", params=params)][-1]

            async with trio.open_nursery() as n:
                n.start_soon(one, "bad", SamplingParams(max_tokens=8, constraint=Constraint("regex", "[a-")))
                n.start_soon(one, "kind", SamplingParams(max_tokens=8, constraint=Constraint("sound", "x")))
                n.start_soon(one, "free", SamplingParams(max_tokens=8, seed=1))
            return results

    r = trio.run(main)
    # refused at the front door, never queued
    assert isinstance(r["bad"], Rejected) and r["bad"].code == "bad_constraint", r["bad"]
    assert "invalid regex" in r["bad"].message and "unclosed character class" in r["bad"].message
    assert isinstance(r["kind"], Rejected) and r["kind"].code == "bad_request" and "constraint" in r["kind"].message
    assert isinstance(r["free"], Finished) and r["free"].usage.completion_tokens == 8


def test_compile_grammar_names_the_problem():
    with pytest.raises(ValueError, match="invalid JSON schema: Invalid type: nope"):
        compile_grammar(Constraint("json_schema", '{"type": "nope"}'))
    with pytest.raises(ValueError, match="choices are a non-empty list"):
        compile_grammar(Constraint("choice", '["a", ""]'))
    assert compile_grammar(Constraint("lark", 'start: "a" %json {"type": "integer"}'))


def test_stdio_passes_a_constraint_through_and_refuses_a_bad_kind(tiny_model):
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", str(tiny_model)]
    lines = [
        {"type": "generate", "request_id": "c", "prompt": "x",
         "params": {"max_tokens": 16, "seed": 1, "constraint": {"kind": "choice", "spec": '["alpha", "beta"]'}}},
        {"type": "generate", "request_id": "k", "prompt": "x",
         "params": {"constraint": {"kind": "sound", "spec": "x"}}},
    ]
    r = subprocess.run(cmd, input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True,
                       timeout=120)
    events = [json.loads(line) for line in r.stdout.splitlines()]
    text = "".join(e.get("text", "") for e in events if e.get("request_id") == "c" and e["type"] == "delta")
    assert text in ("alpha", "beta"), events
    assert [e["type"] for e in events if e.get("request_id") == "c"][-1] == "finished"
    refused = [e for e in events if e.get("request_id") == "k"]
    assert (refused[-1]["type"] == "rejected" and refused[-1]["code"] == "bad_request"
            and "constraint" in refused[-1]["message"])


@pytest.mark.slow
def test_a_constraint_holds_when_the_sampler_is_its_own_process(tiny_model):
    with EngineThread(EngineConfig(model=str(tiny_model), topology="ipc")) as e:
        events = list(e.client().generate(
            "x", params=SamplingParams(max_tokens=16, seed=1, constraint=Constraint("choice", '["alpha", "beta"]'))))
    assert "".join(ev.text for ev in events if isinstance(ev, Delta)) in ("alpha", "beta")
    assert isinstance(events[-1], Finished) and events[-1].finish_reasons == ["stop"]
