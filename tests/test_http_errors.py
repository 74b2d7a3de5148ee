"""Every bad request to a real `zinfer serve` (with --api-key) gets the right status and an
OpenAI-shaped error naming the problem, and the server serves the next request."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from http_server import running_server, sse_events

pytestmark = pytest.mark.slow

KEY = "sk-test-key"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    # a short context, one running sequence and a waiting queue of one: limits are cheap to reach
    with running_server(smollm2_path, "--max-model-len", "128", "--max-running", "1", api_key=KEY, max_waiting=1) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as client:
        yield client


def assert_answers_next(http, server) -> None:
    """The server still answers (cheap: a generation per bad input costs seconds here)."""
    assert http.get("/v1/models").json()["data"][0]["id"] == server.model
    assert http.post("/tokenize", json={"content": "Hi"}).json()["tokens"]


def assert_serves_next(http, server) -> None:
    r = http.post("/v1/chat/completions",
                  json={"model": server.model, "messages": HI, "temperature": 0, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1


def chat(**fields):
    return {"messages": HI, "max_tokens": 1, **fields}


DEEP = b"[" * 5000 + b"]" * 5000  # msgspec's decoder recurses per level: RecursionError, once a 500


def nested(body: bytes) -> bytes:
    """body (a JSON object) with an unknown field nested 5000 deep."""
    return body[:-1] + b', "extra": ' + DEEP + b"}"


BAD = [
    # (name, path, body, status, param, words in the message)
    ("malformed json", "/v1/chat/completions", b'{"messages": [', 400, None, "not valid JSON"),
    ("invalid utf-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
     400, None, "UTF-8"),
    ("temperature type", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature", "Expected `float"),
    ("temperature range", "/v1/chat/completions", chat(temperature=3), 400, "temperature", "<= 2.0"),
    ("top_p zero", "/v1/chat/completions", chat(top_p=0), 400, "top_p", "> 0.0"),
    ("n zero", "/v1/chat/completions", chat(n=0), 400, "n", ">= 1"),
    ("max_tokens zero", "/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ("messages missing", "/v1/chat/completions", {"max_tokens": 1}, 400, "messages", "missing required field"),
    ("messages empty", "/v1/chat/completions", {"messages": []}, 400, "messages", "length >= 1"),
    ("message without role", "/v1/chat/completions", {"messages": [{"content": "Hi"}]}, 400, "messages[0]", "role"),
    ("image part", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages[0].content", "text content"),
    ("logit_bias key", "/v1/chat/completions", chat(logit_bias={"abc": 1}), 400, "logit_bias", "token ids"),
    ("logit_bias id", "/v1/chat/completions", chat(logit_bias={"99999999": 1}),
     400, "logit_bias", "outside the vocabulary"),
    ("logit_bias value", "/v1/chat/completions", chat(logit_bias={"5": 500}), 400, "logit_bias", "<= 100.0"),
    ("empty stop", "/v1/chat/completions", chat(stop=""), 400, "stop", "empty"),
    ("top_logprobs alone", "/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs", "logprobs: true"),
    ("completion logprobs", "/v1/completions", {"prompt": "Hi", "logprobs": 50}, 400, "logprobs", "<= 20"),
    ("prompt object", "/v1/completions", {"prompt": {"text": "Hi"}}, 400, "prompt", "prompt must be"),
    ("prompt ids outside vocab", "/v1/completions", {"prompt": [1, 99999999]}, 400, "prompt", "outside the vocabulary"),
    ("unknown model", "/v1/chat/completions", chat(model="gpt-4"), 404, "model", "'gpt-4' does not exist"),
    ("too long", "/v1/completions", {"prompt": "word " * 300, "max_tokens": 1}, 400, "prompt", "context"),
    # integers outside 64 bits once crashed the msgpack encoder and with it the whole server
    ("seed over 64 bits", "/v1/chat/completions", chat(seed=10**30), 400, "seed", "2**64-1"),
    ("seed under -2**63", "/v1/chat/completions", chat(seed=-(2**63) - 1), 400, "seed", "-2**63"),
    ("top_k over 64 bits", "/v1/chat/completions", chat(top_k=2**64), 400, "top_k", "<= 2147483647"),
    ("max_tokens over 64 bits", "/v1/completions", {"prompt": "Hi", "max_tokens": 10**30},
     400, "max_tokens", "<= 2147483647"),
    ("n over 64 bits", "/v1/chat/completions", chat(n=2**64), 400, "n", "<= 16"),
    ("logprobs over 64 bits", "/v1/completions", {"prompt": "Hi", "logprobs": 2**64}, 400, "logprobs", "<= 20"),
    ("prompt id over 64 bits", "/v1/completions", {"prompt": [1, 2**64]}, 400, "prompt", "2**31-1"),
    ("prompt id negative", "/v1/completions", {"prompt": [[1, -1]]}, 400, "prompt", "2**31-1"),
    ("logit_bias key over 64 bits", "/v1/chat/completions", chat(logit_bias={str(2**64): 1}),
     400, "logit_bias", "2**31-1"),
    ("detokenize id over 64 bits", "/detokenize", {"tokens": [2**64]}, 400, "tokens[0]", "<= 2147483647"),
    ("detokenize id negative", "/detokenize", {"tokens": [-1]}, 400, "tokens[0]", ">= 0"),
    # msgspec reads an integer literal past 64 bits as a float: it was refused as "got `float`"
    ("add_special over 64 bits", "/tokenize", {"content": "Hi", "add_special": 2**70},
     400, "add_special", "Expected `bool`, got `int`"),
    ("content over 64 bits", "/v1/chat/completions", {"messages": [{"role": "user", "content": -(2**70)}]},
     400, "messages[0].content", "got `int`"),
    # nesting 5000 deep: once a 500 that left zinfer_requests_in_flight at 1
    ("nested chat", "/v1/chat/completions", nested(b'{"messages": [{"role": "user", "content": "Hi"}]}'),
     400, None, "nested too deeply"),
    ("nested prompt", "/v1/completions", b'{"prompt": ' + DEEP + b"}", 400, None, "nested too deeply"),
    ("nested tokenize", "/tokenize", nested(b'{"content": "Hi"}'), 400, None, "nested too deeply"),
    ("nested detokenize", "/detokenize", nested(b'{"tokens": [1]}'), 400, None, "nested too deeply"),
    # sizes and numbers without a bound
    ("temperature out of double range", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e400}', 400, "temperature", "out of range"),
    ("stop list too long", "/v1/chat/completions", chat(stop=["a"] * 17), 400, "stop", "length <= 16"),
    ("stop string too long", "/v1/chat/completions", chat(stop="x" * 513), 400, "stop", "length <= 512"),
    ("logit_bias too many", "/v1/chat/completions", chat(logit_bias={str(i): 1 for i in range(1025)}),
     400, "logit_bias", "length <= 1024"),
    ("messages too many", "/v1/chat/completions", {"messages": HI * 1025, "max_tokens": 1},
     400, "messages", "length <= 1024"),
    ("role too long", "/v1/chat/completions", {"messages": [{"role": "r" * 65, "content": "Hi"}]},
     400, "messages[0].role", "length <= 64"),
    ("repetition_penalty tiny", "/v1/chat/completions", chat(repetition_penalty=1e-300),
     400, "repetition_penalty", "0.01"),
]


@pytest.mark.parametrize("name,path,body,status,param,words", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_refused_in_openai_shape(http, server, name, path, body, status, param, words):
    r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert words in error["message"] and error["param"] == param
    if name == "too long":
        assert error["code"] == "context_length_exceeded" and error["n_ctx"] == 128 and error["n_prompt_tokens"] > 128
    assert_answers_next(http, server)


def test_every_bad_request_leaves_the_server_answering_the_same(http, server):
    """Before and after each bad input: the server is up and a greedy request gets the same text."""
    greedy = {"model": server.model, "messages": [{"role": "user", "content": "Name a fruit."}], "temperature": 0,
              "max_tokens": 6}
    reference = http.post("/v1/chat/completions", json=greedy).json()["choices"][0]["message"]["content"]
    for name, path, body, status, *_ in BAD:
        r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
        assert r.status_code == status, name
        assert http.get("/health").json() == {"status": "ok"}, name  # the process is still there
        assert (http.post("/v1/chat/completions", json=greedy).json()["choices"][0]["message"]["content"]
                == reference), name
    m = server.wait_idle()
    assert m["zinfer_requests_in_flight"] == 0  # every bad generation request was counted as ended


def test_after_every_bad_request_a_generation_still_works(http, server):
    for name, path, body, status, *_ in BAD:
        r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
        assert r.status_code == status, name
    assert_serves_next(http, server)


def test_too_long_stream_is_refused_before_streaming(http, server):
    r = http.post("/v1/completions", json={"prompt": "word " * 300, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_oversized_body_gets_413(http, server):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
    assert r.headers.get("connection") == "close"  # the server drops the unread body with the connection
    assert_serves_next(http, server)


def test_api_key_guards_everything_but_health(server, smollm2_path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics"),
                             ("POST", "/tokenize")):
            r = httpx.request(method, server.url + path, headers=headers, json={})
            assert r.status_code == 401, (headers, path)
            assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=server.model, messages=HI, max_tokens=1)
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as good:
        assert good.chat.completions.create(model=server.model, messages=HI, max_tokens=1).usage.completion_tokens == 1


def test_unknown_path_and_method_get_openai_errors(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_queue_full_gets_429(http, server):
    long = {"model": server.model, "messages": [{"role": "user", "content": "Write a long essay."}],
            "max_tokens": 128, "ignore_eos": True, "stream": True}  # to the context's end
    queued: list[httpx.Response] = []
    with http.stream("POST", "/v1/chat/completions", json=long) as running:
        lines = sse_events(running.iter_lines())  # kept: dropping it would close the connection
        next(lines)  # the one running slot is taken
        waiter = threading.Thread(target=lambda: queued.append(httpx.post(
            server.url + "/v1/chat/completions", headers=server.headers, json=chat(model=server.model), timeout=120)))
        waiter.start()
        deadline = time.monotonic() + 30
        while server.metrics()["zinfer_queue_depth"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.1)
        r = http.post("/v1/chat/completions", json=chat())
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "rate_limit_error" and "queue is full" in r.json()["error"]["message"]
    # leaving the running stream frees the slot: the queued request then completes
    waiter.join(60)
    assert queued and queued[0].status_code == 200
    m = server.wait_idle()
    assert m["zinfer_kv_used_blocks"] == 0 and m['zinfer_requests_total{outcome="cancelled"}'] >= 1
