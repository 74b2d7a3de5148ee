"""A routed stream across a lost replica (gateway/router_stream.py), event by event: what the
next replica is sent, and what the client sees (no gap, no duplicate, one terminal event).
Token ids are the tiny vocabulary's bytes: id = 2 + byte."""

from __future__ import annotations

import pytest

from tiny import write_tiny_gguf
from zinfer.gateway.router_stream import LOST, RoutedStream, Split
from zinfer.messages.client import Delta, Failed, Finished, Generate, Rejected, Started, Usage
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


def test_a_grammar_stream_continues_with_the_sent_tokens_as_the_grammars_prefix(tokenizer):
    s = stream(tokenizer, constraint=Constraint("regex", "[a-z]+", tid("x")))  # a client's own prefix stays first
    s.see(Delta("r", 0, "ab", tid("ab")))
    nxt = s.request()
    assert isinstance(nxt, Generate) and nxt.params.constraint == Constraint("regex", "[a-z]+", tid("xab"))
    assert nxt.prompt_ids == PROMPT + tid("ab")


def test_several_choices_split_into_one_child_per_unfinished_choice_merged_under_their_indexes(tokenizer):
    s = stream(tokenizer, n=3, seed=7)
    shown = s.see(Delta("r", 0, "ab", tid("ab")))
    shown += s.see(Delta("r", 1, "x", tid("x"), finish_reason="stop"))  # choice 1 ended; choice 2 sent nothing
    split = s.request()
    assert isinstance(split, Split) and sorted(split.children) == [0, 2]
    first, third = split.children[0].request(), split.children[2].request()
    assert isinstance(first, Generate) and isinstance(third, Generate)
    assert (first.request_id, first.prompt_ids, first.params.n, first.params.seed, first.params.max_tokens) == \
        ("r/choice-0", PROMPT + tid("ab"), 1, 7, 4)
    assert (third.request_id, third.prompt_ids, third.params.n, third.params.seed, third.params.max_tokens) == \
        ("r/choice-2", PROMPT, 1, 9, 6)  # seed + index, as the engine seeds choice 2
    c0, c2 = split.children[0], split.children[2]
    out = []
    for ev in (Started("r/choice-2", len(PROMPT)), Delta("r/choice-2", 0, "zz", tid("zz"), finish_reason="stop"),
               Finished("r/choice-2", ["stop"], Usage(len(PROMPT), 2), PROMPT)):
        out += [m for e in c2.see(ev) for m in s.merge(2, e)]
    for ev in (Delta("r/choice-0", 0, "cdef", tid("cdef"), finish_reason="length"),
               Finished("r/choice-0", ["length"], Usage(8, 4), PROMPT + tid("ab"))):
        out += [m for e in c0.see(ev) for m in s.merge(0, e)]
    assert [(e.index, e.text) for e in out if isinstance(e, Delta)] == [(2, "zz"), (0, "cdef")]
    assert all(e.request_id == "r" for e in out) and s.done
    assert out[-1] == Finished("r", ["length", "stop", "stop"], Usage(len(PROMPT), 9), PROMPT)
    assert texts(shown) == "abx"


def test_a_split_stream_ends_at_its_first_failed_choice(tokenizer):
    s = stream(tokenizer, n=2)
    s.see(Delta("r", 0, "a", tid("a")))
    s.see(Delta("r", 1, "b", tid("b")))
    split = s.request()
    assert isinstance(split, Split)
    out = s.merge(1, Failed("r/choice-1", "no replica is left", "no_replica"))
    assert out == [Failed("r", "no replica is left", "no_replica")] and s.done
    assert s.merge(0, Delta("r/choice-0", 0, "c", tid("c"))) == []


def test_a_stream_that_cannot_continue_fails_once_with_the_reason(tokenizer):
    s = RoutedStream(Generate("r", prompt="Hello", params=SamplingParams(max_tokens=6)), tokenizer)
    s.see(Started("r", len(PROMPT)))
    s.see(Delta("r", 0, "ab", tid("ab")))
    out = s.request()  # the router could not encode the prompt: its ids are unknown
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], Failed) and out[0].code == LOST
    assert s.done and s.see(Delta("r", 0, "c", tid("c"))) == []


def test_a_refusal_after_the_client_saw_the_stream_start_is_a_failure(tokenizer):
    s = stream(tokenizer)
    s.see(Delta("r", 0, "ab", tid("ab")))
    s.request()
    (out,) = s.see(Rejected("r", "queue_full", "the queue is full"))
    assert isinstance(out, Failed) and out.code == LOST and "the queue is full" in out.message
