"""The scheduler as a user notices it: the real SchedulerCore over the real KV allocator
(tests/scheduler_harness.py), one behaviour per test: first come, first served; prompts
prefilled in chunks within the token budget; preemption when KV runs out, and resumption;
aborts; a failed round failing its own sequences only; at most max_running at a time."""

from __future__ import annotations

import pytest

from scheduler_harness import Harness
from zinfer.actors.scheduler_policy import SchedulerConfig
from zinfer.messages.engine import SamplerDrop, SeqError


def _config(**kw: int) -> SchedulerConfig:
    base = dict(max_running=4, max_waiting=16, token_budget=64, max_model_len=128, block_size=4, num_blocks=64)
    return SchedulerConfig(**(base | kw))


def _run(h: Harness, max_rounds: int = 1000) -> None:
    """Rounds until idle; each sampled token is the round's number, so recomputed KV is checkable."""
    for n in range(max_rounds):
        if not h.start_round():
            return
        h.check()
        h.finish_round({seq_id: 10 + n for seq_id in h.wanting_logits()})
    raise AssertionError(f"still busy after {max_rounds} rounds")


def _first_round(h: Harness, seq_id: int) -> int:
    return next(i for i, r in enumerate(h.sent_rounds) if any(s.seq_id == seq_id for s in r.seqs))


def test_sequences_are_admitted_first_come_first_served():
    h = Harness(_config(max_running=2))
    long_ = h.add([1] * 6, max_tokens=8)
    short = h.add([2] * 6, max_tokens=2)
    third = h.add([3] * 30, max_tokens=2)  # a long prompt ahead of a short one: it still goes first
    fourth = h.add([4] * 2, max_tokens=2)
    _run(h)
    assert _first_round(h, long_) == _first_round(h, short) == 0
    assert 0 < _first_round(h, third) < _first_round(h, fourth)
    assert h.finished == {long_: "length", short: "length", third: "length", fourth: "length"}


def test_a_long_prompt_is_prefilled_in_chunks_within_the_token_budget_while_others_decode():
    h = Harness(_config(token_budget=8))
    decoding = h.add([5, 6], max_tokens=20)
    assert h.start_round()
    h.finish_round({decoding: 7})
    prompt = list(range(1, 21))
    long_ = h.add(prompt, max_tokens=3)
    _run(h)
    rounds = [{s.seq_id: s for s in r.seqs} for r in h.sent_rounds]
    assert all(sum(len(s.token_ids) for s in r.values()) <= 8 for r in rounds)
    chunks = [r[long_] for r in rounds if long_ in r and r[long_].start_pos < len(prompt)]
    assert [(c.start_pos, len(c.token_ids)) for c in chunks] == [(0, 7), (7, 7), (14, 6)]  # the decode takes 1
    assert [c.wants_logits for c in chunks] == [False, False, True]  # a token only once the prompt is in
    assert all(decoding in r for r in rounds[: rounds.index(next(r for r in rounds if long_ in r)) + 3])
    assert h.finished == {decoding: "length", long_: "length"} and len(h.tokens[long_]) == 3


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_when_blocks_run_out_the_youngest_is_preempted_and_resumes_where_it_was(prefix_caching):
    h = Harness(_config(num_blocks=6, max_model_len=64), prefix_caching)  # 24 token slots for two of 18
    old = h.add([1, 2, 3, 4], max_tokens=14)
    young = h.add([5, 6, 7, 8], max_tokens=14)
    _run(h)
    assert h.preempted == [young]  # the oldest running sequence always grows
    assert h.core.preemptions == 1
    restart = next(s for r in h.sent_rounds[1:] for s in r.seqs if s.seq_id == young and s.table_start == 0)
    so_far = [5, 6, 7, 8] + h.tokens[young]
    assert restart.token_ids == so_far[restart.start_pos : restart.start_pos + len(restart.token_ids)]
    assert restart.start_pos == (4 if prefix_caching else 0)  # its full prompt block is cached
    assert restart.start_pos + len(restart.token_ids) > 5  # its output is recomputed too
    assert h.finished == {old: "length", young: "length"}
    assert len(h.tokens[old]) == len(h.tokens[young]) == 14
    assert h.alloc.num_used_blocks == 0


def test_an_abort_mid_prefill_frees_everything_and_the_queue_moves_on():
    h = Harness(_config(token_budget=4, max_running=1))
    aborted = h.add(list(range(1, 13)), max_tokens=4)  # 12 tokens: three chunks of 4
    waiting = h.add([9, 9], max_tokens=2)
    assert h.start_round()
    h.finish_round({})  # the first chunk wants no token
    assert h.alloc.block_table(aborted)
    h.abort(aborted)
    assert h.start_round()
    assert h.kv_updates[-1].free == [aborted]
    r = h.sent_rounds[-1]
    assert [s.seq_id for s in r.seqs] == [waiting] and r.forget == [aborted]
    assert SamplerDrop(aborted) in r.sampler_updates
    h.finish_round({waiting: 7})
    _run(h)
    assert h.finished == {waiting: "length"} and aborted not in h.tokens
    assert h.alloc.num_used_blocks == 0


def test_a_failed_round_fails_its_sequences_only():
    h = Harness(_config())
    a, b = h.add([1, 2, 3], max_tokens=4), h.add([4, 5, 6], max_tokens=4)
    assert h.start_round()
    h.finish_round({a: 7, b: 7})
    gone = h.add([7, 8], max_tokens=4)
    assert h.start_round()  # a and b decode, gone prefills
    h.abort(gone)  # aborted while the round runs: no error for it
    later = h.add([9, 9, 9], max_tokens=2)  # arrives while the round runs
    outputs = h.fail_round("device fault")
    fault = SeqError("engine_failed", "device fault")
    assert [(o.seq_id, o.finish_reason, o.error) for o in outputs.outputs] == [(a, "error", fault), (b, "error", fault)]
    assert outputs.stats.running == 0 and outputs.stats.waiting == 1
    assert h.start_round()
    r = h.sent_rounds[-1]
    assert [s.seq_id for s in r.seqs] == [later]
    # the failed round's updates never reached the sampler: they go again, before those since
    updates = [(type(u).__name__, u.seq_id) for u in r.sampler_updates]
    assert updates == [("SamplerAdd", gone), ("SamplerDrop", gone), ("SamplerAdd", later), ("SamplerDrop", a),
                       ("SamplerDrop", b)]
    h.finish_round({later: 7})
    _run(h)
    assert h.finished == {a: "error:device fault", b: "error:device fault", later: "length"}


def test_a_failed_sample_fails_its_sequence_alone():
    h = Harness(_config())
    ok, bad = h.add([1, 2], max_tokens=3), h.add([3, 4], max_tokens=3)
    assert h.start_round()
    h.finish_round({ok: 7}, {bad: "the logits hold NaN"})
    _run(h)
    assert h.finished == {ok: "length", bad: "error:the logits hold NaN"}
    assert h.tokens[ok] == [7, 10, 11] and h.tokens[bad] == []


def test_at_most_max_running_sequences_run_at_once():
    h = Harness(_config(max_running=3))
    ids = [h.add([i, i + 1, i + 2], max_tokens=3 + i) for i in range(1, 8)]
    for n in range(200):
        if not h.start_round():
            break
        assert len(h.sent_rounds[-1].seqs) <= 3 and len(h.policy.running) <= 3
        h.finish_round({seq_id: 10 + n for seq_id in h.wanting_logits()})
    assert h.finished == {i: "length" for i in ids}


def test_a_full_queue_rejects_and_too_long_a_prompt_is_refused():
    h = Harness(_config(max_waiting=2, max_model_len=16))
    h.add([1], max_tokens=2)
    h.add([2], max_tokens=2)
    full = h.add([3], max_tokens=2)
    too_long = h.add([1] * 16, max_tokens=2)
    assert h.rejected == {full: "queue_full", too_long: "too_long"}
