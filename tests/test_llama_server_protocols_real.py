"""The Anthropic, Ollama and llama-server protocols on a real model (Qwen2.5-Coder-0.5B),
one server for the module, each through its ecosystem's own client (raw HTTP for
llama-server, as llama.vim talks to it): a system prompt and a tool round trip with the
`anthropic` SDK (tool_use -> tool_result -> an answer), streamed events accumulating to
the whole message; the `ollama` client's chat (streamed and not), generate, list, show
and a `format` schema that validates; llama-server's /completion and /infill, whose
fill-in-the-middle from the model's own FIM tokens gives plausible middles.

Greedy and short throughout. The holes here are ones where the 0.5B's middle starts right;
ten holes judged by compiling and testing the filled file are tests/test_infill_real.py
(and tests/benchmarks/bench_infill.py beside llama.cpp)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import ollama
import pytest
from conftest import _model
from http_server import running_server, sse_events

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                     "required": ["city"], "additionalProperties": False},
}
HOLES = [  # (prefix, suffix, how the middle's first line starts)
    ("def factorial(n):\n    if n <= 1:\n        return 1\n    return n * ", "\n\n\ndef double(n):\n    return 2 * n\n",
     "factorial(n - 1)"),
    ("def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = ",
     "\n    return a\n\n\ndef fibs(n):\n    return [fib(i) for i in range(n)]\n", "b, a + b"),
    ("def reverse(s):\n    return s[", "]\n\n\ndef shout(s):\n    return s.upper() + '!'\n", "::-1"),
]


@pytest.fixture(scope="module")
def server():
    with running_server(_model("qwen2.5-coder-0.5b"), "--device", "cpu-fast") as s:  # the device users run
        yield s


def test_anthropic_system_prompt_and_a_tool_round_trip(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300) as client:
        kw = dict(model=server.model, max_tokens=8, system="Answer in French.",
                  messages=[{"role": "user", "content": "Say hello."}], extra_body=GREEDY)
        hello = client.messages.create(**kw)
        with client.messages.stream(**kw) as stream:
            streamed = stream.get_final_message()
        assert hello.content[0].text.strip() and hello.stop_reason in ("end_turn", "max_tokens")
        assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in hello.content]
        assert streamed.stop_reason == hello.stop_reason
        ask = [{"role": "user", "content": "What's the weather in Paris?"}]
        call = client.messages.create(model=server.model, max_tokens=40, tools=[WEATHER], messages=ask,
                                      tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                      extra_body=GREEDY)
        [use] = [b for b in call.content if b.type == "tool_use"]
        assert call.stop_reason == "tool_use" and use.name == "get_weather" and "Paris" in use.input["city"]
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees Celsius"}
        back = [*ask, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
        answer = client.messages.create(model=server.model, max_tokens=16, tools=[WEATHER], messages=back,
                                        tool_choice={"type": "none"}, extra_body=GREEDY)
        # the answer is text, from a prompt that holds the result; what it says is the 0.5B's own: it
        # writes its call out again before anything else (llama.cpp too, on the same prompt)
        assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("end_turn", "max_tokens")
        seen = answer.usage.input_tokens + answer.usage.cache_read_input_tokens
        count = dict(model=server.model, tools=[WEATHER], tool_choice={"type": "none"})
        assert seen == client.messages.count_tokens(**count, messages=back).input_tokens
        assert seen > client.messages.count_tokens(**count, messages=back[:2]).input_tokens  # the result is in
        stopped = client.messages.create(model=server.model, max_tokens=16, stop_sequences=["5"], extra_body=GREEDY,
                                         messages=[{"role": "user", "content": "Count from 1 to 9 with commas."}])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "5"), stopped


def test_ollama_chat_generate_list_show_and_a_format_schema(server):
    client = ollama.Client(host=server.url, timeout=300)
    hi = [{"role": "user", "content": "What is the capital of France? One word."}]
    whole = client.chat(model=server.model, messages=hi, options={"temperature": 0, "num_predict": 6}, stream=False)
    parts = list(client.chat(model=server.model, messages=hi, options={"temperature": 0, "num_predict": 6},
                             stream=True))
    assert "Paris" in whole.message.content and "".join(p.message.content for p in parts) == whole.message.content
    g = client.generate(model=server.model, prompt="def add(a, b):\n    return", raw=True,
                        options={"temperature": 0, "num_predict": 4}, stream=False)
    assert g.response.startswith(" a + b") and g.eval_count <= 4
    assert client.list().models[0].details.family == "qwen2"
    assert "insert" in client.show(server.model).capabilities  # its FIM tokens
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.chat(model=server.model, messages=[{"role": "user", "content": "Name a city in Japan as JSON."}],
                    format=schema, options={"temperature": 0, "num_predict": 40}, stream=False)
    jsonschema.validate(json.loads(r.message.content), schema)


def test_llama_server_completion_and_infill(server):
    body = {"prompt": "def fibonacci(n):", "n_predict": 6, "temperature": 0, "n_probs": 2}
    r = httpx.post(server.url + "/completion", json=body, timeout=300).json()
    assert r["content"].startswith("\n") and r["stop_type"] == "limit" and len(r["completion_probabilities"]) == 6
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True}, timeout=300) as s:
        chunks = [json.loads(e) for e in sse_events(s.iter_lines())]
    assert "".join(c["content"] for c in chunks) == r["content"] and chunks[-1]["timings"]["predicted_n"] == 6
    for prefix, suffix, start in HOLES:
        fill = httpx.post(server.url + "/infill", timeout=300, json={
            "input_prefix": prefix, "input_suffix": suffix, "n_predict": 8, "temperature": 0}).json()
        assert fill["content"].startswith(start), fill["content"]
