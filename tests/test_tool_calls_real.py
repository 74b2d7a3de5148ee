"""Tool calls on real models with the official openai client (issue 33): a compulsory call
(tool_choice "required" or a named function), streamed and not, at temperature 0 and 0.8,
is a 200 whose call's arguments validate against the function's schema, on every model
with a tool template; and a model left to choose ("auto") calls a tool for most of twenty
requests that need one. Before the vocabularies agreed, every forced call on Qwen2.5 was a
500; before fences were read, Qwen2.5-0.5B's answer to "What's the weather in Paris?" was
content."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from conftest import _model
from http_server import running_server
from tool_prompts import NEEDS_A_TOOL, TOOLS

pytestmark = pytest.mark.slow
# the 1.5B's runs are test_tool_calls_real_1_5b.py's: the slow tier's two workers each take a file
MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b"]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
AUTO_FLOOR = {"qwen2.5-coder-0.5b": 18, "qwen2.5-coder-1.5b": 18}
"""tool_choice auto: the fewest of the twenty prompts that must come back as calls (the
issue's goal); SmolLM2-135M's count is reported, not held to one."""


def serve(model: str):
    """A server of `model` on cpu-fast for this file's tests."""
    # cpu-fast: a forced call is checked against its schema, not against the oracle's numbers, and the
    # oracle's float32 copy of the 1.5B (6 GB) made this file most of the slow tier's time. A forced call
    # that max_tokens cuts before it is whole is a 400 naming max_tokens (SmolLM2 at 0.8 once wrote a
    # first call longer than 96 tokens: it came back as content without a call)
    return running_server(_model(model), "--device", "cpu-fast", "--max-running", "8")


@pytest.fixture(scope="module", params=MODELS)
def server(request):
    with serve(request.param) as s:
        yield s


def ask(server, prompt: str, choice, stream: bool, temperature: float) -> list[tuple[str, str]] | str:
    """The (name, arguments) of each call in the answer, through the official client; or the
    error's text when max_tokens ended the compulsory call before it was whole."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        kwargs = dict(model=server.model, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                      tool_choice=choice, temperature=temperature, seed=7, max_tokens=96)
        try:
            if not stream:
                msg = client.chat.completions.create(**kwargs).choices[0].message
                return [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            calls: dict[int, list[str]] = {}
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    entry = calls.setdefault(d.index, ["", ""])
                    if d.function is not None:
                        entry[0] += d.function.name or ""
                        entry[1] += d.function.arguments or ""
            return [(name, args) for name, args in calls.values()]
        except openai.APIError as exc:  # a 400 (whole) or an error event (streamed)
            assert "compulsory tool call" in str(exc) and "max_tokens" in str(exc), exc
            return str(exc)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_compulsory_call_validates_against_its_schema(server, choice, request):
    cases = [(prompt, stream, temperature) for prompt in NEEDS_A_TOOL[:10] for stream in (False, True)
             for temperature in (0.0, 0.8)]
    # CI time (580 s for all 40 x 2): each of the four combinations 5 times, every prompt twice
    if request.node.callspec.params["server"] == "qwen2.5-coder-1.5b":
        cases = [c for i, c in enumerate(cases) if (i // 4 < 5) == (c[1] == (c[2] > 0))]
    named = {"type": "function", "function": {"name": "get_weather"}}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda c: ask(server, c[0], "required" if choice == "required" else named, c[1], c[2]),
                                cases))
    model = request.node.callspec.params["server"]
    cut_short = [case for case, calls in zip(cases, answers) if isinstance(calls, str)]
    # SmolLM2-135M may loop inside a string argument (greedy on cpu-fast, "Should I take an umbrella in
    # London today?" wrote no whole call in 400 tokens): the error that names max_tokens is its answer
    assert not cut_short or model == "smollm2-135m", cut_short
    assert len(cut_short) <= len(cases) // 4, cut_short
    for case, calls in zip(cases, answers):
        if isinstance(calls, str):
            continue
        assert calls, case
        for name, arguments in calls:
            assert name in SCHEMAS and (choice == "required" or name == "get_weather"), (case, name)
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_left_to_choose_the_model_calls_a_tool(server, request):
    if (request.node.callspec.params["server"] == "qwen2.5-coder-1.5b"
            and os.environ.get("ZINFER_TEST_AUTO_1_5B") != "1"):
        pytest.skip("CI time: ZINFER_TEST_AUTO_1_5B=1 counts the 1.5B's auto calls too")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: ask(server, p, "auto", False, 0.0), NEEDS_A_TOOL))
    called = sum(1 for calls in answers if calls and all(name in SCHEMAS for name, _ in calls))
    name = request.node.callspec.params["server"]
    print(f"\n{name}: {called} of {len(NEEDS_A_TOOL)} auto answers are tool calls")
    assert called >= AUTO_FLOOR.get(name, 0), [(p, a) for p, a in zip(NEEDS_A_TOOL, answers) if not a]
