"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) of a real `zinfer
serve`, as the official `anthropic` SDK sees it, on a tiny random model: a streamed
message accumulates to the whole one, a forced tool call comes back as a tool_use block
whose input follows the schema and its tool_result is taken back, and every bad request
is answered in Anthropic's error shape (the SDK's typed errors) with the server serving on.
Real-model answers are in test_llama_server_protocols_real.py."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import msgspec
import pytest
from http_server import running_server
from tiny import write_tiny_gguf

from zinfer.gateway.anthropic_schema import (
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolChoiceParam,
    ToolParam,
    ToolResultBlock,
    ToolUseBlock,
    chat_request,
)

KEY = "sk-anthropic"
HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"temperature": 0}  # the SDK no longer lists temperature; the HTTP API takes it
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
                     "additionalProperties": False},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama",
                            max_position_embeddings=2048)  # room for the tools prompt
    with running_server(model, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def without_ids(message) -> list[dict]:
    return [{k: v for k, v in b.model_dump().items() if k not in ("id", "parsed_output", "citations")}
            for b in message.content]


def refusal(client, **kw) -> anthropic.APIStatusError:
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(**{"model": "m", "max_tokens": 4, "messages": HI, **kw})
    return info.value


def test_create_and_stream_give_the_same_message(client, server):
    kw = dict(model=server.model, max_tokens=6, system="Be brief.", messages=HI, extra_body=GREEDY)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        types = [e.type for e in stream]
        streamed = stream.get_final_message()
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.model == server.model
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text
    assert without_ids(streamed) == without_ids(whole)
    assert (streamed.stop_reason, whole.stop_reason) == ("max_tokens", "max_tokens")
    assert whole.usage.output_tokens == streamed.usage.output_tokens == 6
    total = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert total == streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
    assert types[0] == "message_start" and types[-1] == "message_stop" and "content_block_delta" in types
    counted = client.messages.count_tokens(model=server.model, system="Be brief.", messages=HI)
    assert counted.input_tokens == total


def test_a_forced_tool_call_round_trip(client, server):
    one = {"disable_parallel_tool_use": True}
    kw = dict(model=server.model, max_tokens=120, tools=[WEATHER], tool_choice={"type": "any", **one},
              messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY)
    first = client.messages.create(**kw)
    assert first.stop_reason == "tool_use"
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    assert without_ids(streamed) == without_ids(first)
    history = [*kw["messages"], {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]}]
    answer = client.messages.create(**{**kw, "messages": history, "tool_choice": {"type": "none"}, "max_tokens": 4})
    assert answer.stop_reason == "max_tokens" and [b.type for b in answer.content] == ["text"]


def test_tool_choice_and_blocks_translate_to_the_chat_request():
    req = MessagesRequest(model="m", max_tokens=4, messages=[MessageParam("user", "Hi")],
                          tools=[ToolParam(name="f", input_schema={"type": "object"})],
                          tool_choice=ToolChoiceParam(type="tool", name="f", disable_parallel_tool_use=True))
    chat = chat_request(req)
    assert chat.tool_choice.function.name == "f" and chat.parallel_tool_calls is False
    assert chat_request(msgspec.structs.replace(req, tool_choice=ToolChoiceParam(type="any"))).tool_choice == "required"
    turns = chat_request(msgspec.structs.replace(req, tool_choice=None, messages=[
        MessageParam("assistant", [ToolUseBlock(id="t1", name="f", input={"a": 1})]),
        MessageParam("user", [ToolResultBlock(tool_use_id="t1", content="42", is_error=True), TextBlock(text="ok?")]),
    ])).messages
    assert [(m.role, m.content) for m in turns] == [("assistant", None), ("tool", "Error: 42"), ("user", "ok?")]
    assert turns[0].tool_calls[0].function.arguments == '{"a": 1}' and turns[1].tool_call_id == "t1"


def test_thinking_and_cache_control_are_accepted(client, server):
    m = client.messages.create(model=server.model, max_tokens=2, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               system=[{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}])
    assert m.usage.output_tokens == 2


def test_bad_requests_get_anthropics_errors_and_the_server_serves_on(client, server):
    e = refusal(client, model=server.model, extra_body={"frequency_penalty": 1})
    assert e.status_code == 400 and e.body["type"] == "error"
    assert e.body["error"]["type"] == "invalid_request_error" and "frequency_penalty" in e.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    e = refusal(client, model=server.model, messages=[{"role": "user", "content": [image]}])
    assert "messages[0].content[0].type" in e.body["error"]["message"]
    e = refusal(client, model=server.model, tools=[WEATHER], tool_choice={"type": "sometimes"})
    assert "tool_choice.type" in e.body["error"]["message"]
    e = refusal(client, model=server.model, extra_body={"temperature": 1.5})
    assert "temperature" in e.body["error"]["message"]
    e = refusal(client, model=server.model, max_tokens=0)
    assert "max_tokens" in e.body["error"]["message"]
    assert isinstance(refusal(client, model="claude-nope"), anthropic.NotFoundError)
    with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as other:
        with pytest.raises(anthropic.AuthenticationError) as info:
            other.messages.create(model=server.model, max_tokens=2, messages=HI)
    assert info.value.body["error"]["type"] == "authentication_error"
    big = httpx.post(server.url + "/v1/messages", content=b"x" * (5 << 20),
                     headers={"x-api-key": KEY, "content-type": "application/json"}, timeout=60)
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    evil = httpx.post(server.url + "/v1/messages", json={"model": server.model, "max_tokens": 2, "messages": HI},
                      headers={"x-api-key": KEY, "origin": "http://evil.example"})
    assert evil.status_code == 403  # the origin check, as on the OpenAI routes, in Anthropic's shape
    assert evil.json()["type"] == "error" and evil.json()["error"]["type"] == "permission_error"
    form = httpx.post(server.url + "/v1/messages", content=b"a=1",
                      headers={"x-api-key": KEY, "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415 and form.json()["error"]["type"] == "invalid_request_error"
    before = server.metrics()
    assert client.messages.create(model=server.model, max_tokens=2, messages=HI).usage.output_tokens == 2
    after = server.metrics()
    assert after['zinfer_requests_total{outcome="finished"}'] == before['zinfer_requests_total{outcome="finished"}'] + 1
