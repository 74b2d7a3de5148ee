"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`) of a real `zinfer serve`, as the official `ollama` client sees it, on a
tiny random model: the NDJSON stream concatenates to the whole answer, `format` (a JSON
schema) constrains the answer, a tool-call history is taken, and bad options and names
are answered in Ollama's error shape with the server serving on. Real-model answers are
in test_llama_server_protocols_real.py."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest
from http_server import running_server
from tiny import write_tiny_gguf

HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"temperature": 0, "num_predict": 5}
COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
         "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama", max_position_embeddings=2048)
    with running_server(model) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def refused(client, server, **kw) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(**{"model": server.model, "messages": HI, "stream": False, **kw})
    return info.value


def test_chat_streamed_and_not_give_the_same_answer(client, server):
    whole = client.chat(model=server.model, messages=HI, options=GREEDY, stream=False)
    parts = list(client.chat(model=server.model, messages=HI, options=GREEDY, stream=True))
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 5 and whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.eval_count == 5 and last.prompt_eval_count == whole.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration > 0
    raw = httpx.post(server.url + "/api/chat", json={"model": server.model, "messages": HI, "options": GREEDY})
    assert raw.headers["content-type"] == "application/x-ndjson"  # Ollama streams unless told not to
    assert [json.loads(x)["done"] for x in raw.text.splitlines()] == [p.done for p in parts]


def test_generate_templated_and_raw(client, server):
    templated = client.generate(model=server.model, prompt="Hi", options=GREEDY, stream=False)
    chat = client.chat(model=server.model, messages=HI, options=GREEDY, stream=False)
    assert templated.response == chat.message.content and templated.done_reason == "length"
    raw = list(client.generate(model=server.model, prompt="Hi", raw=True, options=GREEDY, stream=True))
    assert raw[-1].done and raw[-1].prompt_eval_count < templated.prompt_eval_count  # no template around it
    loaded = client.generate(model=server.model + ":latest")
    assert loaded.done_reason == "load" and loaded.response == ""


def test_format_schema_makes_the_answer_validate(client, server):
    r = client.chat(model=server.model, messages=HI, format=COLOR, options={"temperature": 0.8, "seed": 3},
                    stream=False)
    jsonschema.validate(json.loads(r.message.content), COLOR)
    r = client.generate(model=server.model, prompt="Hi", format="json", options={"temperature": 0, "num_predict": 3},
                        stream=False)
    assert r.response.startswith("{")


def test_list_show_ps_and_version(client, server):
    [m] = client.list().models
    assert m.model == server.model and m.size > 0 and m.details.format == "gguf" and m.details.family == "llama"
    shown = client.show(server.model)
    assert shown.details.quantization_level == "F32" and shown.modelinfo["llama.context_length"] == 2048
    assert "completion" in shown.capabilities and "insert" not in shown.capabilities  # no FIM tokens
    [running] = client.ps().models
    assert running.model == server.model and running.context_length == 2048
    assert httpx.get(server.url + "/api/version").json()["version"]


def test_a_tool_call_history_is_taken(client, server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": COLOR}}]
    history = [*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"color": "red"}}}]},
        {"role": "tool", "content": "Sunny", "tool_name": "get_weather"}]
    r = client.chat(model=server.model, messages=history, tools=tools, options=GREEDY, stream=False)
    assert r.done and r.prompt_eval_count > 0


def test_bad_requests_get_ollamas_errors_and_the_server_serves_on(client, server):
    e = refused(client, server, options={"num_gpu": 1})
    assert e.status_code == 400 and "num_gpu" in e.error
    assert "nonsense" in refused(client, server, options={"nonsense": 1}).error
    assert "temperature" in refused(client, server, options={"temperature": "hot"}).error
    assert "num_ctx" in refused(client, server, options={"num_ctx": 1 << 20}).error
    assert "repeat_last_n" in refused(client, server, options={"repeat_penalty": 1.2, "repeat_last_n": 64}).error
    assert "think" in refused(client, server, think=True).error
    assert "messages[0].role" in refused(client, server, messages=[{"role": "robot", "content": "x"}]).error
    assert refused(client, server, model="llama3:8b").status_code == 404
    suffix = httpx.post(server.url + "/api/generate", json={"model": server.model, "prompt": "a", "suffix": "b"})
    assert suffix.status_code == 400 and "suffix" in suffix.json()["error"]  # no FIM tokens
    bad = httpx.post(server.url + "/api/chat", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and set(bad.json()) == {"error"}
    assert client.chat(model=server.model, messages=HI, options=GREEDY, stream=False).eval_count == 5
