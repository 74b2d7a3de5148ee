"""A routed stream across a lost replica (gateway/router_stream.py), event by event: what the
next replica is sent, and what the client sees (no gap, no duplicate, one terminal event).
Token ids are the tiny vocabulary's bytes: id = 2 + byte."""

from __future__ import annotations

import pytest

from tiny import write_tiny_gguf
from zinfer.gateway.router_stream import LOST, RoutedStream
from zinfer.messages.client import Delta, Failed, Finished, Generate, Started, Usage
from zinfer.messages.params import Constraint, SamplingParams
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder

PROMPT = [2 + b for b in b"Hello"]


def tid(ch: str) -> list[int]:
    return [2 + b for b in ch.encode()]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf", "llama")
    return PromptBuilder.from_source(open_model(path)).tokenizer


def stream(tokenizer, **params: object) -> RoutedStream:
    p = SamplingParams(temperature=0.0, **{"max_tokens": 6, **params})  # type: ignore[arg-type]
    s = RoutedStream(Generate("r", prompt_ids=PROMPT, params=p), tokenizer)
    assert s.see(Started("r", len(PROMPT))) == [Started("r", len(PROMPT))]
    return s


def texts(events) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta))


def test_nothing_streamed_resends_the_request_as_it_was(tokenizer):
    s = stream(tokenizer)
    assert s.request() is s.original
    assert s.see(Started("r", len(PROMPT))) == []  # the next replica's Started is not shown again


def test_a_continuation_starts_from_prompt_and_tokens_and_counts_the_whole_stream(tokenizer):
    s = stream(tokenizer)
    s.see(Delta("r", 0, "ab", tid("ab")))
    nxt = s.request()
    assert isinstance(nxt, Generate) and nxt.prompt_ids == PROMPT + tid("ab") and nxt.params.max_tokens == 4
    assert not nxt.add_special and nxt.prompt is None
    out = s.see(Delta("r", 0, "cdef", tid("cdef"), finish_reason="length"))
    out += s.see(Finished("r", ["length"], Usage(len(PROMPT) + 2, 4), PROMPT + tid("ab")))
    assert texts(out) == "cdef" and s.done
    assert out[-1] == Finished("r", ["length"], Usage(len(PROMPT), 6), PROMPT)


def test_a_stop_string_that_spans_the_move_still_ends_the_stream(tokenizer):
    s = stream(tokenizer, stop=["xy"])
    shown = s.see(Delta("r", 0, "a", tid("ax")))  # the lost replica held "x" back: it may begin "xy"
    assert isinstance(s.request(), Generate)
    out = s.see(Delta("r", 0, "y", tid("y")))  # the next replica saw only "y": no stop for it
    assert texts(shown + out) == "a"
    assert out[-1] == Finished("r", ["stop"], Usage(len(PROMPT), 3), PROMPT)
    assert [e.finish_reason for e in out if isinstance(e, Delta)] == ["stop"]


def test_a_character_cut_by_the_move_comes_out_whole(tokenizer):
    s = stream(tokenizer)
    first, second = tid("é")
    shown = s.see(Delta("r", 0, "", [first]))
    s.request()
    out = s.see(Delta("r", 0, "\ufffd", [second]))  # the next replica cannot decode a lone tail byte
    assert texts(shown + out) == "é"


def test_a_stream_that_ended_but_lost_its_terminal_event_finishes(tokenizer):
    s = stream(tokenizer, max_tokens=2)
    s.see(Delta("r", 0, "ok", tid("ok"), finish_reason="length"))
    out = s.request()
    assert out == [Finished("r", ["length"], Usage(len(PROMPT), 2), PROMPT)] and s.done


@pytest.mark.parametrize("params", [dict(n=2), dict(constraint=Constraint("regex", "[a-z]+"))])
def test_streams_that_cannot_continue_fail_once_with_the_reason(tokenizer, params):
    s = stream(tokenizer, **params)
    s.see(Delta("r", 0, "ab", tid("ab")))
    out = s.request()
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], Failed) and out[0].code == LOST
    assert s.done and s.see(Delta("r", 0, "c", tid("c"))) == []
