"""Tool calls on the chat API (the parser of the model's text: tests/test_tool_call_parser.py): the
grammar of a compulsory call, the prompts tools render into, and a real `zinfer serve`
through the official `openai` client (a tiny random model; Qwen2.5-Coder in the slow tier)."""

from __future__ import annotations

import json

import llguidance
import openai
import pytest
from http_server import running_server
from tiny import tiny_tokenizer_json, write_tiny_gguf

from zinfer.gateway.client import Client
from zinfer.gateway.openai_tools import ToolPlan, call_grammar
from zinfer.gateway.tool_call_parser import Call, parse_tool_calls
from zinfer.messages.client import Detokenize, Tokenize, TokenizeResult
from zinfer.models.tool_prompt import as_dicts, call_syntax, hermes_messages, template_tools

WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
}
TOOLS = [{"type": "function", "function": WEATHER}]
NAMES = {"get_weather"}
MODEL = "tiny"


def call_block(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


# ---- the grammar of a compulsory call ----------------------------------------------------


@pytest.fixture(scope="module")
def ll_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("lltok") / "tokenizer.json"
    path.write_text(tiny_tokenizer_json())
    return llguidance.LLTokenizer(str(path))


def grammar_accepts(tok, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar), log_level=0)
    return m.consume_tokens(tok.tokenize_str(text)) and not m.is_error() and m.is_accepting()


NOOP = {"name": "noop"}


def test_required_grammar_takes_calls_whose_arguments_fit_the_schema(ll_tokenizer):
    g = call_grammar(ToolPlan([WEATHER, NOOP], "required", parallel=True))
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", g), ll_tokenizer) == ""
    assert grammar_accepts(ll_tokenizer, g, call_block("get_weather", {"city": "Paris"}))
    assert grammar_accepts(ll_tokenizer, g, call_block("noop", {}) + "\n" + call_block("get_weather", {"city": "Rome"}))
    assert not grammar_accepts(ll_tokenizer, g, call_block("get_weather", {"town": "Paris"}))  # not the schema
    assert not grammar_accepts(ll_tokenizer, g, call_block("other", {}))
    assert not grammar_accepts(ll_tokenizer, g, "Sure! " + call_block("noop", {}))


def test_named_grammar_takes_that_function_once_without_parallel_calls(ll_tokenizer):
    g = call_grammar(ToolPlan([WEATHER, NOOP], "get_weather", parallel=False))
    assert grammar_accepts(ll_tokenizer, g, call_block("get_weather", {"city": "Paris"}))
    assert not grammar_accepts(ll_tokenizer, g, call_block("noop", {}))
    assert not grammar_accepts(ll_tokenizer, g,
                               call_block("get_weather", {"city": "a"}) + "\n"
                               + call_block("get_weather", {"city": "b"}))


def test_grammar_keeps_schema_refs_resolvable(ll_tokenizer):
    fn = {"name": "place", "parameters": {"type": "object",
                                          "$defs": {"City": {"type": "string", "enum": ["Paris", "Rome"]}},
                                          "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"]}}
    g = call_grammar(ToolPlan([fn], "required", parallel=False))
    assert grammar_accepts(ll_tokenizer, g, call_block("place", {"city": "Rome"}))
    assert not grammar_accepts(ll_tokenizer, g, call_block("place", {"city": "Oslo"}))


def test_llama3_grammar_takes_one_json_call_with_parameters(ll_tokenizer):
    g = call_grammar(ToolPlan([WEATHER, NOOP], "required", parallel=True, syntax="llama3"))
    assert grammar_accepts(ll_tokenizer, g, json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}))
    assert not grammar_accepts(ll_tokenizer, g, json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}))
    assert not grammar_accepts(ll_tokenizer, g, call_block("get_weather", {"city": "Oslo"}))
    # and the parser reads what it allows
    assert parse_tool_calls(json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}), NAMES) == (
        None, [Call("get_weather", '{"city": "Oslo"}')])


def test_call_syntax_follows_the_template():
    from zinfer.models.chat_template import CHATML_TEMPLATE

    llama31 = ('Respond in the format {"name": function name, "parameters": dictionary of argument name '
               'and its value}. {{- "<|python_tag|>" }}')
    qwen = "For each function call, return a json object within <tool_call></tool_call> XML tags"
    assert [call_syntax(t) for t in (llama31, qwen, CHATML_TEMPLATE, None)] == ["llama3", "hermes", "hermes", "hermes"]


# ---- the prompt of a template without tool support ------------------------------------------


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'},
]


def test_hermes_fallback_lists_tools_in_the_system_message_and_wraps_results():
    out = hermes_messages(as_dicts(HISTORY), template_tools([WEATHER]))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert (json.dumps({"type": "function", "function": WEATHER}) in out[0]["content"]
            and "<tool_call>" in out[0]["content"])
    assert out[2]["content"] == call_block("get_weather", {"city": "Paris"})
    assert out[3]["content"] == '<tool_response>\n{"temperature_c": 21}\n</tool_response>'


# ---- a real server on a tiny random model ----------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("tools") / "tiny.gguf", "llama", seed=3,
                            max_position_embeddings=4096)  # room for the tools listing
    with running_server(model, "--max-model-len", "4096", "--served-model-name", MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def bad_request(oai, **kw) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **kw)
    return e.value.body


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"tools": [{"type": "function", "function": {**WEATHER, "name": "get weather!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {**WEATHER, "name": "x" * 65}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {**WEATHER, "name": "get_weather\n"}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS * 129}, "tools"),
        ({"tools": [{"type": "function", "function": {**WEATHER, "parameters": {"description": "x" * (65 << 10)}}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "retrieval", "function": WEATHER}]}, "tools[0].type"),
    ],
    ids=["name-chars", "name-length", "name-newline", "unknown-named-choice", "bad-choice", "choice-without-tools",
         "too-many", "schema-size", "type"],
)
def test_bad_tools_are_400_with_the_param(oai, kw, param):
    assert bad_request(oai, **kw)["param"] == param


def test_a_tool_message_needs_its_call_id(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[*HISTORY[:2], {"role": "tool", "content": "21"}],
                                    max_tokens=2)
    assert e.value.body["param"] == "messages[2].tool_call_id"


def test_tool_results_are_rendered_into_the_prompt(oai):
    def prompt_tokens(result: str) -> int:
        messages = [*HISTORY[:2], {**HISTORY[2], "content": result}]
        return oai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                           max_tokens=1).usage.prompt_tokens

    assert (prompt_tokens('{"temperature_c": 21, "sky": "clear, with a light breeze from the west"}')
            > prompt_tokens('{"temperature_c": 21}') + 10)


def test_tools_and_the_history_reach_the_template(server):
    """Through the front door: the tiny model has no template, so its ChatML fallback gets
    the Hermes listing, the assistant's call and the wrapped result as text."""
    with Client(server.zmq, timeout_s=60) as c:
        c.send(Tokenize("t", messages=HISTORY, tools=[WEATHER]))
        ids = next(e.token_ids for e in c.events("t") if isinstance(e, TokenizeResult))
        c.send(Detokenize("d", ids))
        text = next(e.text for e in c.events("d") if isinstance(e, TokenizeResult))
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '"name": "get_weather"' in text and call_block("get_weather", {"city": "Paris"}) in text
    assert "<|im_start|>user\n<tool_response>\n{\"temperature_c\": 21}\n</tool_response><|im_end|>" in text


def test_tool_choice_none_renders_no_tools(oai):
    def prompt_tokens(**kw) -> int:
        return oai.chat.completions.create(model=MODEL, messages=HISTORY[:1], max_tokens=1, **kw).usage.prompt_tokens

    assert prompt_tokens(tools=TOOLS, tool_choice="none") == prompt_tokens()
    assert prompt_tokens(tools=TOOLS) > prompt_tokens() + 50


SHORT_CITY = {"name": "get_weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                             "required": ["city"], "additionalProperties": False}}
NOOP_TOOL = {"type": "function",
             "function": {"name": "noop",
                          "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_compulsory_call_on_a_random_model_fits_the_schema(oai, choice, stream):
    """The grammar makes even random weights call: the named function (or one of the
    tools), arguments that validate, finish_reason tool_calls; one call without parallel_tool_calls."""
    tools = [{"type": "function", "function": SHORT_CITY}, NOOP_TOOL]
    kw = dict(model=MODEL, messages=HISTORY[:1], tools=tools, tool_choice=choice, parallel_tool_calls=False,
              max_tokens=100, temperature=1, seed=3)
    if stream:
        calls, reason, content = reassembled(oai.chat.completions.create(stream=True, **kw))
    else:
        (c,) = oai.chat.completions.create(**kw).choices
        calls, reason, content = ([(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
                                  c.finish_reason, c.message.content)
    assert reason == "tool_calls" and content is None, content
    ((name, arguments),) = calls
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 6
    else:
        assert choice == "required" and name == "noop" and args == {}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_compulsory_call_cut_short_is_an_error_naming_max_tokens(oai, stream):
    """max_tokens that ends a compulsory call before it is whole: a 400 (whole) or an error
    event that ends the stream, naming max_tokens, never content without a call."""
    kw = dict(model=MODEL, messages=HISTORY[:1], tools=[{"type": "function", "function": SHORT_CITY}],
              tool_choice="required", max_tokens=4, temperature=0)
    with pytest.raises(openai.APIError) as err:
        if stream:
            list(oai.chat.completions.create(stream=True, **kw))
        else:
            oai.chat.completions.create(**kw)
    assert "max_tokens" in str(err.value) and "compulsory tool call" in str(err.value)
    if not stream:
        assert isinstance(err.value, openai.BadRequestError) and err.value.body["param"] == "max_tokens"
    whole = oai.chat.completions.create(**{**kw, "max_tokens": 100, "parallel_tool_calls": False})
    assert whole.choices[0].message.tool_calls  # with room for the call: it comes, and the server serves on


def reassembled(chunks) -> tuple[list[tuple[str, str]], str | None, str | None]:
    """(name, arguments) per call index, the finish_reason and the content, from a stream."""
    calls: dict[int, list[str]] = {}
    reason, content = None, None
    for chunk in chunks:
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for t in c.delta.tool_calls or []:
                entry = calls.setdefault(t.index, ["", ""])
                if t.function and t.function.name:
                    assert t.id and t.id.startswith("call_") and not entry[0]  # the id and name come first, once
                    entry[0] = t.function.name
                entry[1] += (t.function.arguments or "") if t.function else ""
            reason = c.finish_reason or reason
    return [tuple(calls[i]) for i in sorted(calls)], reason, content


# ---- slow: Qwen2.5-Coder 0.5B, whose own template renders the tools ---------------------------


@pytest.fixture(scope="module")
def qwen():
    from conftest import _model  # the shared model cache and its slow-marker check

    with running_server(_model("qwen2.5-coder-0.5b"), "--device", "cpu-fast", "--max-model-len", "2048",
                        "--served-model-name", MODEL) as s:
        with openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
            yield client


ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.mark.slow
def test_qwen_calls_the_tool_and_answers_from_its_result(qwen):
    first = qwen.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=100)
    (c,) = first.choices
    assert c.finish_reason == "tool_calls", c.message.content
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"].lower().startswith("paris")
    # the streamed request's deltas reassemble to the same call
    calls, reason, content = reassembled(qwen.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                                      temperature=0, max_tokens=100, stream=True))
    assert (calls, reason, content) == ([(call.function.name, call.function.arguments)], "tool_calls",
                                        c.message.content)
    # the result goes back as a tool message and the model answers from it
    result = json.dumps({"city": "Paris", "temperature_c": 17, "sky": "light rain"})
    history = [*ASK, c.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": result}]
    answer = qwen.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=80)
    (a,) = answer.choices
    assert a.finish_reason == "stop" and not a.message.tool_calls
    assert "17" in a.message.content, a.message.content
