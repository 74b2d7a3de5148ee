"""The parser of the model's text into content and tool calls (gateway/tool_call_parser.py),
whole and streamed, and the stream deltas it becomes (gateway/openai_tools.StreamedCalls)."""

from __future__ import annotations

import json
import random

import pytest
from test_openai_tools import NAMES, call_block

from zinfer.gateway.openai_tools import StreamedCalls
from zinfer.gateway.tool_call_parser import Call, ToolCallParser, parse_tool_calls


def merged(pieces: list) -> list:
    """Adjacent content pieces joined: what a client appending content deltas sees."""
    out: list = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        else:
            out.append(p)
    return out


def fed_in_parts(text: str, cuts: list[int], names: set[str] = NAMES) -> tuple[list, list[list]]:
    """The parser's pieces for text fed cut at `cuts`, and what each feed returned."""
    p = ToolCallParser(set(names))
    bounds = [0, *cuts, len(text)]
    each = [p.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    return [x for got in each for x in got] + p.finish(), each


# ---- the parser --------------------------------------------------------------------------


def test_one_hermes_call_with_text_before_it():
    text = "Let me look that up.\n" + call_block("get_weather", {"city": "Paris"})
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "Let me look that up."
    assert calls == [Call("get_weather", '{"city": "Paris"}')]


def test_several_hermes_calls_and_no_content():
    text = call_block("get_weather", {"city": "Paris"}) + "\n" + call_block("get_time", {"zone": "CET"}) + "\n"
    content, calls = parse_tool_calls(text, NAMES)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                 ("get_time", {"zone": "CET"})]


def test_llama3_json_form_whole_message_and_after_python_tag():
    for text in ['{"name": "get_weather", "parameters": {"city": "Oslo"}}',
                 '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}']:
        assert parse_tool_calls(text, NAMES) == (None, [Call("get_weather", '{"city": "Oslo"}')])
    # a JSON answer that names no offered function is the content
    text = '{"name": "Ada", "parameters": {"born": 1815}}'
    assert parse_tool_calls(text, NAMES) == (text, [])


def test_malformed_json_inside_a_tag_is_left_as_content():
    text = 'Sure: <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call> done'
    assert parse_tool_calls(text, NAMES) == (text, [])
    text = call_block("get_weather", {"city": "Rome"}) + '\n<tool_call>\n{"name": 3}\n</tool_call>'
    content, calls = parse_tool_calls(text, NAMES)
    assert content == '<tool_call>\n{"name": 3}\n</tool_call>' and [c.name for c in calls] == ["get_weather"]


def test_text_without_calls_is_unchanged():
    for text in ["Hello there.\n", "a < b and b <tool", "", "  spaced  "]:
        assert parse_tool_calls(text, NAMES) == (text, [])


def test_forms_models_really_write_are_calls():
    """Qwen2.5-Coder-0.5B answers "What's the weather in Paris?" at temperature 0 with the
    first form: a fenced call in content, no tool_calls, before the parser read fences."""
    paris = [Call("get_weather", '{"city": "Paris"}')]
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    for text in [
        "```json\n" + json.dumps(call, indent=2) + "\n```",
        "```\n" + json.dumps(call) + "\n```\n",
        json.dumps([call]),
        "<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": {"city": "Paris"}}),
        json.dumps({"type": "function", "function": call}),
        "```json\n" + json.dumps(call),  # an unclosed fence at the end of the text
    ]:
        assert parse_tool_calls(text, NAMES) == (None, paris), text
    two = parse_tool_calls("```json\n" + json.dumps([call, {"name": "get_time", "parameters": {"zone": "CET"}}])
                           + "\n```", NAMES | {"get_time"})
    assert [c.name for c in two[1]] == ["get_weather", "get_time"] and two[0] is None
    content, calls = parse_tool_calls("Let me check.\n```json\n" + json.dumps(call) + "\n```\nOne moment.", NAMES)
    assert content == "Let me check.One moment." and calls == paris


def test_a_close_tag_inside_a_json_string_does_not_end_the_block():
    """SmolLM2 at temperature 0.8, forced to call get_weather, wrote this city."""
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Malt</tool_call>"}}\n</tool_call>'
    assert parse_tool_calls(block + "\n" + block, NAMES) == (
        None, [Call("get_weather", '{"city": "Malt</tool_call>"}')] * 2)
    pieces, _ = fed_in_parts(block, [20, 60, 70])
    assert pieces == [Call("get_weather", '{"city": "Malt</tool_call>"}')]


def test_fences_that_hold_no_call_stay_as_written():
    for text in [
        "Here:\n```python\nprint({'name': 'get_weather'})\n```\n",
        "```json\n" + json.dumps({"name": "not_offered", "arguments": {}}) + "\n```",
        "```json\n[]\n```",
        "a ``` b",
    ]:
        assert parse_tool_calls(text, NAMES) == (text, []), text
    fenced = "```json\n" + json.dumps({"name": "get_weather", "arguments": {}}) + "\n```"
    assert parse_tool_calls(fenced, set()) == (fenced, [])  # no tools offered: no call


STREAMED = [
    "Checking.\n```json\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}) + "\n```\nDone.",
    "```python\nx = 1\n```\n" + json.dumps({"name": "get_weather"}),
    "I will check.\n" + call_block("get_weather", {"city": "Paris"}) + "\n"
    + call_block("get_weather", {"city": "Lyon"}),
    'x <tool_call>\n{bad}\n</tool_call> then <tool_c',
    "  " + json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}),
    "no calls here, just <b>markup</b> and a <tool",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_pieces_equal_the_whole_and_no_partial_tag_leaks(text):
    whole = merged(fed_in_parts(text, [])[0])
    for seed in range(200):
        cuts = sorted(random.Random(seed).sample(range(1, len(text)), min(8, len(text) - 1)))
        pieces, each = fed_in_parts(text, cuts)
        assert merged(pieces) == whole, cuts
        # a malformed block comes out whole, tags and all
        for got in each[:-1] if "<tool_call>\n{bad" not in text else []:
            assert not any(isinstance(g, str) and "<tool" in g for g in got), (cuts, got)


def test_a_tag_split_across_deltas_never_reaches_content():
    pieces, each = fed_in_parts("Hi <tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {}})
                                + "\n</tool_call>", [4, 5, 8, 14])
    assert each[0] == ["Hi"] and each[1] == [] and each[2] == []  # "<", "<too" held back
    assert pieces == ["Hi", Call("get_weather", "{}")]


def test_stream_deltas_reassemble_to_the_call():
    text = call_block("get_weather", {"city": "Paris"})
    s = StreamedCalls(NAMES)
    deltas = [d for k in range(0, len(text), 3) for d in s.deltas(0, text[k:k + 3])] + s.finish(0)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d["tool_calls"]:
            c = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "", "arguments": ""})
            c["name"] += tc.get("function", {}).get("name", "")
            c["arguments"] += tc["function"].get("arguments", "")
    assert (deltas[0]["tool_calls"][0]["id"].startswith("call_")
            and deltas[0]["tool_calls"][0]["function"]["name"] == "get_weather")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    assert s.reason(0, "stop") == "tool_calls" and s.reason(0, "length") == "length" and s.reason(1, "stop") == "stop"
