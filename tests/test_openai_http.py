"""The OpenAI-compatible HTTP API of a real `zinfer serve` (SmolLM2), driven by the official
`openai` package and httpx, checked against the engine's own output over ZeroMQ."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from http_server import running_server, sse_events

from zinfer.gateway.client import Client
from zinfer.messages.client import Delta, Finished, Started
from zinfer.messages.params import SamplingParams

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Hi"}]
PROMPTS = [
    "What is the capital of France?",
    "Name three colors.",
    "Count from one to five.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "What is water made of?",
    "Name a fruit.",
    "What day comes after Monday?",
]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--max-running", "16") as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def engine_output(server, params: SamplingParams, **form) -> tuple[str, int]:
    """Text and prompt token count of one request sent to the engine's front door directly."""
    with Client(server.zmq, timeout_s=120) as c:
        text, prompt_tokens = [], None
        for ev in c.generate(**form, params=params):
            if isinstance(ev, Started):
                prompt_tokens = ev.prompt_tokens
            elif isinstance(ev, Delta):
                text.append(ev.text)
            elif not isinstance(ev, Finished):
                raise AssertionError(f"engine ended with {ev}")
        return "".join(text), prompt_tokens


def chat_stream_text(oai, model, messages, **kw) -> str:
    stream = oai.chat.completions.create(model=model, messages=messages, stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_health_said_loading_then_ok(server):
    assert server.saw_loading
    r = httpx.get(server.url + "/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_models_lists_the_served_model(oai, server):
    models = oai.models.list().data
    assert [m.id for m in models] == [server.model]
    assert oai.models.retrieve(server.model).id == server.model


def test_chat_matches_engine_and_reports_usage(oai, server):
    want, n_prompt = engine_output(server, SamplingParams(temperature=0, max_tokens=16), messages=HI)
    r = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=16)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.total_tokens == n_prompt + r.usage.completion_tokens
    # the same prompt again is served from the prefix cache
    again = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=16)
    assert again.choices[0].message.content == want
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_model_path_is_accepted_as_the_model_name(oai, smollm2_path):
    r = oai.chat.completions.create(model=str(smollm2_path), messages=HI, temperature=0, max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_chat_stream_equals_non_stream_and_ends_with_usage(oai, server):
    whole = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=12)
    chunks = list(oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=12,
                                              stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_framing_ends_with_done(server):
    body = {"model": server.model, "prompt": "The capital of France is", "temperature": 0, "max_tokens": 3,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]" and len(events) >= 2


def test_completions_stream_and_not_match_engine(oai, server):
    prompt = "The capital of France is"
    want, n_prompt = engine_output(server, SamplingParams(temperature=0, max_tokens=8), prompt=prompt)
    r = oai.completions.create(model=server.model, prompt=prompt, temperature=0, max_tokens=8)
    assert r.choices[0].text == want and r.usage.prompt_tokens == n_prompt
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in oai.completions.create(model=server.model, prompt=prompt,
                                                                         temperature=0, max_tokens=8, stream=True)
                       if c.choices)
    assert streamed == want


def engine_greedy_with_margin(server, messages, max_tokens: int) -> tuple[str, float]:
    """The engine's greedy text and its smallest top-1 minus top-2 logprob gap over the steps."""
    with Client(server.zmq, timeout_s=300) as c:
        text, margin = [], float("inf")
        for ev in c.generate(messages=messages,
                             params=SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=2)):
            if isinstance(ev, Delta):
                text.append(ev.text)
                margin = min([margin, *(top[0].logprob - top[1].logprob for top in ev.top_logprobs or [])])
        return "".join(text), margin


def test_16_concurrent_streams_equal_the_engine_greedy_output(oai, server):
    """16 concurrent OpenAI streams get the text the engine itself gives the same greedy
    requests, every one: the oracle's rows do not depend on the batch (tests/test_oracle_rows.py)."""
    chats = [[{"role": "user",
               "content": PROMPTS[i % len(PROMPTS)] + (" Answer briefly." if i >= len(PROMPTS) else "")}]
             for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        want = [w for w, _ in pool.map(lambda m: engine_greedy_with_margin(server, m, 8), chats)]
        got = list(pool.map(lambda m: chat_stream_text(oai, server.model, m, temperature=0, max_tokens=8), chats))
    assert all(got)
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w]


def test_chat_logprobs_are_the_tokens_with_sorted_alternatives(oai, server):
    r = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=6, logprobs=True,
                                    top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert t.top_logprobs[0].token == t.token and t.logprob == pytest.approx(tops[0])  # greedy picks the top one
        assert bytes(t.bytes).decode() == t.token


def test_completions_logprobs_int(oai, server):
    r = oai.completions.create(model=server.model, prompt="The capital of France is", temperature=0, max_tokens=4,
                               logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(x)
               for top, x in zip(lp.top_logprobs, lp.token_logprobs))


def test_n_choices_with_seed_are_reproducible(oai, server):
    kw = dict(model=server.model, messages=[{"role": "user", "content": "Tell me a story."}], temperature=1.0,
              max_tokens=10, n=3, seed=1234)
    oai.chat.completions.create(**kw)  # warm the prefix cache: a cached prefix shifts logits a little
    a, b = oai.chat.completions.create(**kw), oai.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # each choice samples with its own stream
    assert 3 <= a.usage.completion_tokens <= 30  # all choices counted


def test_stop_string_and_list_end_the_text_before_the_stop(oai, server):
    full = oai.completions.create(model=server.model, prompt="Count: 1, 2, 3,", temperature=0,
                                  max_tokens=12).choices[0].text
    cut = full.index(",", 2)
    assert cut > 0
    stop = full[cut : cut + 2]
    for value in (stop, [stop, "never-appears"]):
        r = oai.completions.create(model=server.model, prompt="Count: 1, 2, 3,", temperature=0, max_tokens=12,
                                   stop=value)
        assert r.choices[0].text == full[: full.index(stop)]
        assert r.choices[0].finish_reason == "stop"


def test_max_completion_tokens_limits_chat(oai, server):
    r = oai.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Write a long poem."}],
                                    temperature=0, max_completion_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_logit_bias_forces_a_token(oai, server):
    tid = httpx.post(server.url + "/tokenize", json={"content": " banana", "add_special": False}).json()["tokens"][0]
    r = oai.completions.create(model=server.model, prompt="Hello", temperature=0, max_tokens=4,
                               logit_bias={str(tid): 100})
    word = httpx.post(server.url + "/detokenize", json={"tokens": [tid]}).json()["content"]
    assert r.choices[0].text == word * 4


def test_extension_and_penalty_fields_change_sampling(oai, server):
    kw = dict(model=server.model, prompt="Count: 1, 2, 3,", max_tokens=12)
    greedy = oai.completions.create(temperature=0, **kw).choices[0].text
    # top_k=1 and min_p=1 leave only the best token: greedy even at a high temperature
    assert oai.completions.create(temperature=1.5, seed=3, extra_body={"top_k": 1}, **kw).choices[0].text == greedy
    assert oai.completions.create(temperature=1.5, seed=3, extra_body={"min_p": 1.0}, **kw).choices[0].text == greedy
    # the greedy count repeats ", " tokens: penalties on repeats change it
    assert oai.completions.create(temperature=0, extra_body={"repetition_penalty": 3.0}, **kw).choices[0].text != greedy
    assert oai.completions.create(temperature=0, frequency_penalty=2.0, **kw).choices[0].text != greedy


def test_tokenize_detokenize_round_trip(server):
    with Client(server.zmq) as c:
        want = c.tokenize("Hello world", add_special=False)
    r = httpx.post(server.url + "/tokenize", json={"content": "Hello world", "add_special": False})
    assert r.json() == {"tokens": want}
    assert httpx.post(server.url + "/detokenize", json={"tokens": want}).json() == {"content": "Hello world"}


def test_metrics_count_a_request_and_its_tokens(oai, server):
    before = server.wait_idle()
    r = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=4)
    after = server.wait_idle()
    assert after['zinfer_requests_total{outcome="finished"}'] == before['zinfer_requests_total{outcome="finished"}'] + 1
    assert (after["zinfer_generation_tokens_total"] - before["zinfer_generation_tokens_total"]
            == r.usage.completion_tokens)
    assert after["zinfer_prompt_tokens_total"] - before["zinfer_prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["zinfer_time_to_first_token_seconds_count"] == before["zinfer_time_to_first_token_seconds_count"] + 1
    assert (after["zinfer_inter_token_latency_seconds_count"] - before["zinfer_inter_token_latency_seconds_count"]
            == r.usage.completion_tokens - 1)
    assert after["zinfer_kv_blocks"] > 0


def test_disconnect_mid_stream_cancels_and_frees_kv(server):
    before = server.wait_idle()
    body = {"model": server.model, "messages": [{"role": "user", "content": "Write a very long essay about the sea."}],
            "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        events = sse_events(r.iter_lines())
        for _ in range(4):
            next(events)
    # the connection is closed here, mid-stream
    during = time.monotonic()
    after = server.wait_idle(timeout=30)
    assert time.monotonic() - during < 30
    assert (after['zinfer_requests_total{outcome="cancelled"}']
            == before['zinfer_requests_total{outcome="cancelled"}'] + 1)
    assert after["zinfer_kv_used_blocks"] == 0 and after["zinfer_engine_open_requests"] == 0
    # and a generation far shorter than the 2000 tokens asked for was counted
    assert after["zinfer_generation_tokens_total"] - before["zinfer_generation_tokens_total"] < 200
