"""OpenAI API conformance of a real `zinfer serve` (SmolLM2), as the official `openai`
package sees it: how a stream ends, lists of prompts, defaults, error params, roles,
system_fingerprint and --served-model-name."""

from __future__ import annotations

import httpx
import openai
import pytest
from http_server import running_server

from zinfer.gateway.client import Client
from zinfer.messages.client import Tokenize, TokenizeResult

pytestmark = pytest.mark.slow

NAME, ALIAS = "smol", "smol-alias"
HI = [{"role": "user", "content": "Hi"}]
LONG = "word " * 600  # more tokens than --max-model-len 512


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--served-model-name", NAME, ALIAS, "--max-model-len", "512",
                        "--max-running", "8") as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def chat_prompt_ids(server) -> list[int]:
    """HI through the chat template as token ids: a completion of them ends with EOS."""
    with Client(server.zmq, timeout_s=60) as c:
        c.send(Tokenize("hi-ids", messages=HI))
        return next(e.token_ids for e in c.events("hi-ids") if isinstance(e, TokenizeResult))


def as_a_client_reads_it(chunks, chat: bool) -> tuple[dict[int, str], dict[int, str]]:
    """Text per choice appended only while finish_reason is null, and each choice's finish_reason."""
    text: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            assert c.index not in reasons, "a chunk came after the choice's finish_reason"
            if c.finish_reason is None:
                text[c.index] = text.get(c.index, "") + ((c.delta.content or "") if chat else c.text)
            else:
                assert (c.delta.content or "" if chat else c.text) == ""  # the final chunk's delta is empty
                reasons[c.index] = c.finish_reason
    return text, reasons


@pytest.mark.parametrize("stop", ["length", "stop"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_stream_text_and_finish_equal_the_whole_response(oai, chat_prompt_ids, chat, n, stop):
    """A client that appends text while finish_reason is null gets all of it: the last token
    is not on the chunk that carries finish_reason (for a length stop and an EOS stop)."""
    kw = dict(model=NAME, temperature=0, n=n, max_tokens=6 if stop == "length" else 100)
    if chat:
        whole = oai.chat.completions.create(messages=HI, **kw)
        chunks = oai.chat.completions.create(messages=HI, stream=True, **kw)
        want = {c.index: c.message.content for c in whole.choices}
    else:
        whole = oai.completions.create(prompt=chat_prompt_ids, **kw)
        chunks = oai.completions.create(prompt=chat_prompt_ids, stream=True, **kw)
        want = {c.index: c.text for c in whole.choices}
    assert [c.finish_reason for c in whole.choices] == [stop] * n
    assert all(want.values())
    text, reasons = as_a_client_reads_it(chunks, chat)
    assert text == want
    assert reasons == dict.fromkeys(range(n), stop)


def test_a_list_of_prompts_gets_a_choice_per_prompt_and_n(oai):
    prompts = ["The capital of France is", "Count: 1, 2, 3,", "Name a fruit:"]
    singles = [oai.completions.create(model=NAME, prompt=p, temperature=0, max_tokens=5) for p in prompts]
    r = oai.completions.create(model=NAME, prompt=prompts, temperature=0, max_tokens=5, n=2)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles for _ in range(2)]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert r.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    text, reasons = as_a_client_reads_it(oai.completions.create(model=NAME, prompt=prompts, temperature=0, max_tokens=5,
                                                                n=2, stream=True), chat=False)
    assert text == {c.index: c.text for c in r.choices}
    assert reasons == dict.fromkeys(range(6), "length")


def test_a_list_of_token_id_prompts(oai, server):
    prompts = ["The capital of France is", "Name a fruit:"]
    ids = [httpx.post(server.url + "/tokenize", json={"content": p}).json()["tokens"] for p in prompts]
    by_text = oai.completions.create(model=NAME, prompt=prompts, temperature=0, max_tokens=4)
    by_ids = oai.completions.create(model=NAME, prompt=ids, temperature=0, max_tokens=4)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert len(by_ids.choices) == 2 and by_ids.usage.prompt_tokens == sum(map(len, ids))


def test_one_refused_prompt_refuses_the_request_and_cancels_the_rest(oai, server):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            oai.completions.create(model=NAME, prompt=["Write a long story.", LONG], max_tokens=400,
                                   extra_body={"ignore_eos": True}, stream=stream)
        assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    m = server.wait_idle()
    assert m["zinfer_kv_used_blocks"] == 0 and m["zinfer_engine_open_requests"] == 0


def test_too_many_prompts_are_refused(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=NAME, prompt=["Hi"] * 65, max_tokens=1)
    assert e.value.body["param"] == "prompt" and "at most 64" in e.value.body["message"]


def test_completions_default_to_16_tokens(oai):
    r = oai.completions.create(model=NAME, prompt="Once upon a time", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_context_overflow_names_prompt_or_messages(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=NAME, prompt=LONG, max_tokens=1)
    assert (e.value.body["code"], e.value.body["param"]) == ("context_length_exceeded", "prompt")
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=NAME, messages=[{"role": "user", "content": LONG}], max_tokens=1)
    assert (e.value.body["code"], e.value.body["param"]) == ("context_length_exceeded", "messages")


def test_unknown_role_is_refused_naming_it(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=NAME, messages=[*HI, {"role": "robot", "content": "beep"}], max_tokens=1)
    assert e.value.body["param"] == "messages[1].role" and "'robot'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=NAME,
                                    messages=[{"role": "user",
                                               "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                                    max_tokens=1)
    assert e.value.body["param"] == "messages[0].content"


def test_developer_role_is_the_system_role(oai):
    def reply(role: str) -> str:
        messages = [{"role": role, "content": "Answer in French."}, *HI]
        return oai.chat.completions.create(model=NAME, messages=messages, temperature=0,
                                           max_tokens=8).choices[0].message.content

    assert reply("developer") == reply("system")


def test_tool_role_is_taken(oai):
    messages = [*HI, {"role": "assistant", "content": "Hello"},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    assert oai.chat.completions.create(model=NAME, messages=messages, max_tokens=2).usage.completion_tokens >= 1


def test_system_fingerprint_is_one_string_in_every_response_and_chunk(oai):
    seen = {
        oai.chat.completions.create(model=NAME, messages=HI, max_tokens=2).system_fingerprint,
        oai.completions.create(model=NAME, prompt="Hi", max_tokens=2).system_fingerprint,
        *(c.system_fingerprint for c in oai.chat.completions.create(model=NAME, messages=HI, max_tokens=2, stream=True,
                                                                    stream_options={"include_usage": True})),
        *(c.system_fingerprint for c in oai.completions.create(model=NAME, prompt="Hi", max_tokens=2, stream=True)),
    }
    assert len(seen) == 1
    assert seen.pop().startswith("zinfer-0.1.0-")


def test_served_model_name_and_alias(oai, smollm2_path):
    assert [m.id for m in oai.models.list().data] == [NAME]
    assert oai.models.retrieve(ALIAS).id == NAME
    for name in (NAME, ALIAS):
        assert oai.chat.completions.create(model=name, messages=HI, max_tokens=1).model == NAME
        assert oai.completions.create(model=name, prompt="Hi", max_tokens=1).model == NAME
    for other in (str(smollm2_path), "gpt-4"):  # the names given replace the model's path
        with pytest.raises(openai.NotFoundError) as e:
            oai.chat.completions.create(model=other, messages=HI, max_tokens=1)
        assert e.value.body["code"] == "model_not_found"
