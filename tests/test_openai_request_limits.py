"""Requests the OpenAI routes refuse for what they ask, not for how busy the server is,
against a real `zinfer serve` on a tiny random model with the openai client: best_of,
which the engine does not do, and more sequences than the server can ever queue."""

from __future__ import annotations

import openai
import pytest
from http_server import running_server
from tiny import write_tiny_gguf

from zinfer.gateway.client import Client
from zinfer.messages.client import Finished, Rejected
from zinfer.messages.params import SamplingParams

MODEL = "tiny"
MAX_WAITING = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_gguf(tmp_path_factory.mktemp("limits") / "tiny.gguf", "llama", max_position_embeddings=512)
    with running_server(model, "--served-model-name", MODEL, "--max-running", "4", max_waiting=MAX_WAITING) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def complete(oai, prompt, **kw):
    return oai.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, **kw)


@pytest.mark.parametrize("best_of, n", [(3, None), (3, 2), (1, 2)])
def test_best_of_other_than_n_is_refused_naming_it(oai, best_of, n):
    """Before, best_of was dropped unread: best_of=3 answered one choice generated alone."""
    with pytest.raises(openai.BadRequestError) as e:
        complete(oai, "Hi", best_of=best_of, n=n)
    assert e.value.body["param"] == "best_of" and "best_of" in e.value.body["message"], e.value.body


@pytest.mark.parametrize("best_of, n", [(1, None), (2, 2)])
def test_best_of_equal_to_n_is_served(oai, best_of, n):
    assert len(complete(oai, "Hi", best_of=best_of, n=n).choices) == (n or 1)


def test_more_sequences_than_the_queue_holds_is_400_not_429(oai):
    """Before, 64 prompts x n=16 was refused queue_full (429), as if a retry could succeed."""
    for prompts, n, param in ((["Hi"] * 64, 16, "prompt"), (["Hi"] * 3, 3, "prompt"), ("Hi", MAX_WAITING + 1, "n")):
        with pytest.raises(openai.BadRequestError) as e:
            complete(oai, prompts, n=n)
        body = e.value.body
        assert body["param"] == param and str(MAX_WAITING) in body["message"] and "max-waiting" in body["message"], body
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                    n=MAX_WAITING + 1)
    assert e.value.body["param"] == "n", e.value.body
    assert len(complete(oai, ["Hi"] * 4, n=2).choices) == MAX_WAITING  # as many as the queue holds: served


def test_zeromq_refuses_more_choices_than_the_queue_holds(server):
    """The same refusal at the engine's front door, for ZeroMQ, stdio and the websocket: n past
    --max-waiting is bad_request (before: queue_full, every time)."""
    with Client(server.zmq, timeout_s=60) as c:
        events = list(c.generate("Hi", params=SamplingParams(max_tokens=2, n=MAX_WAITING + 1)))
        assert isinstance(events[-1], Rejected) and events[-1].code == "bad_request", events[-1]
        assert "--max-waiting" in events[-1].message and str(MAX_WAITING) in events[-1].message
        assert isinstance(list(c.generate("Hi", params=SamplingParams(max_tokens=2, n=MAX_WAITING)))[-1], Finished)
