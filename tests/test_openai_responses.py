"""OpenAI's Responses API (`POST /v1/responses`) of a real `zinfer serve`, as the official
`openai` package sees it: the Response object and its typed stream events validate
against the package's own types, the text equals what /v1/chat/completions gives for the
same greedy request, and what zinfer does not do (store, previous_response_id, images)
is refused naming the field. Fast tier on a tiny random model; one slow test on SmolLM2."""

from __future__ import annotations

import json

import httpx
import msgspec
import openai
import pydantic
import pytest
import trio
from http_server import running_server
from openai.types.responses import Response, ResponseStreamEvent
from tiny import write_tiny_gguf

from zinfer.gateway.openai_responses import ResponsesShaper
from zinfer.gateway.openai_responses_schema import ResponsesRequest
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Delta, Failed, Finished, Usage

KEY = "sk-responses"
HI = [{"role": "user", "content": "Hi"}]
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama",
                            max_position_embeddings=2048)  # room for the tools prompt
    with running_server(model, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        yield client


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json=body, headers=server.headers, timeout=120)


def refusal(oai, **kw) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        oai.responses.create(**kw)
    return info.value


def test_create_gives_a_typed_response_with_chats_text(oai, server):
    chat = oai.chat.completions.create(model=server.model, messages=HI, temperature=0, max_tokens=8)
    r = oai.responses.create(model=server.model, input="Hi", temperature=0, max_output_tokens=8)
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.id.startswith("resp_") and r.object == "response" and r.model == server.model
    [item] = r.output
    assert (item.type, item.role, [c.type for c in item.content]) == ("message", "assistant", ["output_text"])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.error is None and r.temperature == 0 and r.max_output_tokens == 8


def test_the_raw_response_validates_against_the_packages_types(server):
    body = post(server, {"input": "Hi", "temperature": 0, "max_output_tokens": 4}).json()
    r = Response.model_validate(body)  # every field the type requires is there, typed right
    assert r.output_text and r.store is False and r.usage.input_tokens_details.cached_tokens >= 0


def test_max_output_tokens_ends_incomplete_with_the_reason(oai):
    r = oai.responses.create(input="Hi", temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_stream_gives_the_typed_events_in_order_and_the_same_text(oai):
    whole = oai.responses.create(input="Hi", temperature=0, max_output_tokens=8)
    events = list(oai.responses.create(input="Hi", temperature=0, max_output_tokens=8, stream=True))
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert [t for i, t in enumerate(types[:-1])
            if t != "response.output_text.delta" or types[i - 1] != t] == STREAM_ORDER
    assert types[-1] == "response.incomplete" and len(deltas) >= 1
    assert "".join(deltas) == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == 8


def test_stream_helper_accumulates_the_deltas(oai, server):
    whole = oai.responses.create(input="Hello there", temperature=0, max_output_tokens=6)
    with oai.responses.stream(model=server.model, input="Hello there", temperature=0, max_output_tokens=6) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert text == whole.output_text


def test_raw_stream_names_each_event_and_each_validates(server):
    body = {"input": "Hi", "temperature": 0, "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, headers=server.headers, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert len(lines) % 2 == 0 and "[DONE]" not in "".join(lines)
    for name, data in zip(lines[::2], lines[1::2]):
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)


def test_instructions_are_a_system_message_before_the_input(oai, server):
    plain = oai.responses.create(input="Hi", temperature=0, max_output_tokens=1)
    told = oai.responses.create(input="Hi", instructions="Answer in French.", temperature=0, max_output_tokens=1)
    system = [{"role": "system", "content": "Answer in French."}, *HI]
    chat = oai.chat.completions.create(model=server.model, messages=system, temperature=0, max_tokens=1)
    assert told.usage.input_tokens == chat.usage.prompt_tokens > plain.usage.input_tokens
    assert told.instructions == "Answer in French."


def test_input_items_with_roles_and_text_parts_equal_the_chat_messages(oai, server):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": " there"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "Again"},
    ]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]
    r = oai.responses.create(input=items, temperature=0, max_output_tokens=4)
    chat = oai.chat.completions.create(model=server.model, messages=messages, temperature=0, max_tokens=4)
    assert (r.output_text, r.usage.input_tokens) == (chat.choices[0].message.content, chat.usage.prompt_tokens)


def test_function_call_and_its_output_reach_the_prompt(oai):
    def call_and_result(output: str) -> list[dict]:
        return [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": output},
        ]

    asked = oai.responses.create(input=call_and_result("")[:1], temperature=0, max_output_tokens=1)
    short = oai.responses.create(input=call_and_result("22"), temperature=0, max_output_tokens=1)
    long = oai.responses.create(input=call_and_result("22 degrees, sunny, light wind from the west"), temperature=0,
                                max_output_tokens=1)
    assert asked.usage.input_tokens < short.usage.input_tokens < long.usage.input_tokens


COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
         "additionalProperties": False}


def test_text_format_json_schema_makes_random_weights_answer_in_the_schema(oai, server):
    fmt = {"format": {"type": "json_schema", "name": "color", "schema": COLOR, "strict": True}}
    r = oai.responses.create(model=server.model, input="Pick a color", text=fmt, temperature=0.8, max_output_tokens=40)
    assert r.status == "completed" and json.loads(r.output_text)["color"] in ("red", "green", "blue")
    assert r.text.format.type == "json_schema" and r.text.format.name == "color"
    streamed = list(oai.responses.create(model=server.model, input="Pick a color", text=fmt, temperature=0,
                                         max_output_tokens=40, stream=True))
    assert (streamed[-1].type == "response.completed"
            and json.loads(streamed[-1].response.output_text)["color"] in ("red", "green", "blue"))


def test_text_format_json_object_starts_a_json_object(oai):
    r = oai.responses.create(input="Hi", text={"format": {"type": "json_object"}}, temperature=0, max_output_tokens=8)
    assert r.output_text.lstrip().startswith("{")  # random weights may not close it within 8 tokens


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
                   "additionalProperties": False},
}


def test_a_required_tool_call_round_trip(oai, server):
    """tool_choice "required" makes random weights call the function with arguments in its
    schema; streamed, the call's events rebuild the same call; sent back with its output,
    the conversation renders and is answered."""
    kw = dict(model=server.model, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
              parallel_tool_calls=False, temperature=0, max_output_tokens=120)
    r = oai.responses.create(**kw)
    [call] = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    events = list(oai.responses.create(**kw, stream=True))
    for e in events:
        EVENTS.validate_python(e.to_dict())
    types = [e.type for e in events]
    assert types[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    streamed = events[-1].response.output[-1]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)
    back = [{"role": "user", "content": "Weather in Paris?"}, call.to_dict(),
            {"type": "function_call_output", "call_id": call.call_id, "output": "22 C and sunny"}]
    answer = oai.responses.create(model=server.model, input=back, tools=[WEATHER], temperature=0, max_output_tokens=4)
    assert answer.usage.input_tokens > r.usage.input_tokens and answer.output


def test_a_named_tool_choice_calls_that_function(oai, server):
    other = {**WEATHER, "name": "get_time", "description": "The time in a city"}
    r = oai.responses.create(model=server.model, input="Hi", tools=[WEATHER, other],
                             tool_choice={"type": "function", "name": "get_time"},
                             parallel_tool_calls=False, temperature=0.7, max_output_tokens=120)
    assert [item.name for item in r.output if item.type == "function_call"] == ["get_time"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"store": True}, "store", "stateless"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
         "input[0].content[0]", "input_image"),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role", "robot"),
        ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}]},
         "input[0].call_id", "call_9"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type", "web_search_call"),
        ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"temperature": 3}, "temperature", "<= 2.0"),
        ({"text": {"format": {"type": "sound"}}}, "text.format.type", "sound"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "schema"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
         "text.format", "nonsense"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
         "tool_choice", "'g'"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", "matching regex"),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, "tools", "unique"),
    ],
)
def test_what_zinfer_does_not_do_is_refused_naming_the_field(oai, fields, param, words):
    e = refusal(oai, **{"input": "Hi", **fields})
    assert (e.status_code, e.body["param"]) == (400, param) and words in e.body["message"]


def test_unknown_model_missing_key_and_unknown_fields(oai, server):
    assert refusal(oai, model="gpt-5", input="Hi").status_code == 404
    too_long = refusal(oai, model=server.model, input="word " * 3000)
    assert (too_long.status_code, too_long.body["param"], too_long.body["code"]) == (
        400, "input", "context_length_exceeded")
    streamed = refusal(oai, model=server.model, input="word " * 3000, stream=True)  # refused before the stream starts
    assert (streamed.status_code, streamed.body["param"]) == (400, "input")
    assert httpx.post(server.url + "/v1/responses", json={"input": "Hi"}).status_code == 401
    r = post(server, {"input": "Hi", "max_output_tokens": 1, "metadata": {"k": "v"}, "reasoning": {"effort": "low"}})
    assert r.status_code == 200 and r.json()["status"] == "incomplete"  # unknown fields are ignored, as on chat


def test_a_client_leaving_mid_stream_cancels_its_request(server):
    before = server.wait_idle()['zinfer_requests_total{outcome="cancelled"}']
    body = {"input": "Hi", "max_output_tokens": 200, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, headers=server.headers, timeout=120) as r:
        assert any("response.output_text.delta" in line for line in r.iter_lines())
    m = server.wait_idle()
    assert m['zinfer_requests_total{outcome="cancelled"}'] == before + 1 and m["zinfer_kv_used_blocks"] == 0


def shaped(tools: set[str] | None, events: list) -> tuple[list[dict], dict]:
    """The stream events and the whole Response the shaper makes of these engine events."""
    req = msgspec.json.decode(b'{"input": "Hi"}', type=ResponsesRequest)
    shaper = ResponsesShaper(GatewayState(model_name="m"), req, "r", tools)

    async def one_by_one(items: list):
        for e in items:
            yield e

    async def both():
        frames = [f async for f in shaper.stream(events[0], one_by_one(events[1:]), True)]
        return frames, await shaper.collect(one_by_one(events))

    frames, whole = trio.run(both)
    parsed = []
    for f in frames:
        name, data = f.decode().strip().split("\n")
        parsed.append(json.loads(data.removeprefix("data: ")))
        assert name == "event: " + parsed[-1]["type"]
        EVENTS.validate_python(parsed[-1])
    return parsed, whole


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


def test_an_engine_failure_mid_stream_ends_with_response_failed():
    events, _ = shaped(None, [Delta("r", text="Hel"), Delta("r", text="lo"), Failed("r", "an actor died")])
    assert [e["type"] for e in events][-3:] == ["response.output_text.delta", "response.output_text.delta",
                                                "response.failed"]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == "server_error" and "an actor died" in failed.error.message


def test_text_and_a_call_stream_as_a_message_then_a_function_call_like_the_whole_response():
    text = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]  # tags split across deltas
    usage = Usage(prompt_tokens=5, completion_tokens=len(pieces))
    events, whole = shaped({"get_weather"}, [*(Delta("r", text=p) for p in pieces), Finished("r", ["stop"], usage)])
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and without_ids(final["output"]) == without_ids(whole["output"])
    message, call = Response.model_validate(final).output
    assert (message.type, message.content[0].text) == ("message", "Let me check.")
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Let me check."
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"] == [call.arguments]


@pytest.mark.slow
def test_smollm2_answers_the_capital_of_france(smollm2_path):
    with (running_server(smollm2_path) as s,
          openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120) as oai):
        question = "What is the capital of France? Answer in one sentence."
        r = oai.responses.create(input=question, instructions="You are a helpful assistant.", temperature=0,
                                 max_output_tokens=64)
        assert r.status == "completed" and "Paris" in r.output_text
        with oai.responses.stream(model=s.model, input=question, instructions="You are a helpful assistant.",
                                  temperature=0, max_output_tokens=64) as stream:
            final = stream.get_final_response()
        assert final.status == "completed" and final.output_text == r.output_text
