"""Speculative decoding in the scheduler as a user notices it: the real SchedulerCore over the real
KV allocator (tests/scheduler_harness.py) with a fake greedy model whose output repeats itself, so
prompt-lookup drafts are often right and sometimes wrong. Drafted runs give the same tokens as
plain runs, under continuous batching, preemption, stop tokens, max_tokens and aborts; the KV of
rejected drafts is in no block table once the round is back; drafting stops at high concurrency.
With a draft model, the real DraftModel (actors/draft_model.py) answers the scheduler's asks over a
simulated KV memory of its own pool and a fake draft model that is right most of the time: the
same tokens again, and the draft pool holds exactly the sequences' tokens."""

from __future__ import annotations

import numpy as np

from scheduler_harness import EOS, Harness
from zinfer.actors.draft_model import Chunk, DraftModel
from zinfer.actors.scheduler_policy import SchedulerConfig
from zinfer.actors.speculation import NgramDrafter, SpeculationConfig
from zinfer.messages.engine import DraftAsk, DraftReply, DraftSeq


def _config(mode: str = "ngram", max_batch: int = 8, **kw: int) -> SchedulerConfig:
    base = dict(max_running=4, max_waiting=16, token_budget=64, max_model_len=256, block_size=4, num_blocks=96)
    draft = "fake" if mode == "draft" else ""
    spec = SpeculationConfig(mode=mode, max_draft=8, draft_max=4, max_batch=max_batch, draft_model=draft)
    return SchedulerConfig(**(base | kw), speculation=spec)


def model(ids: list[int]) -> int:
    """A fake greedy model: mostly copies the token 6 back (so its text repeats), now and then not."""
    n = len(ids)
    if n % 11 == 0:
        return 1 + (sum(ids) % 29)
    return ids[n - 6] if n >= 6 else 3 + n


def _run(h: Harness, max_rounds: int = 2000, abort_at: dict[int, int] | None = None) -> None:
    for n in range(max_rounds):
        for seq_id, at in (abort_at or {}).items():
            if n == at:
                h.abort(seq_id)
        if not h.start_round():
            return
        h.check()
        h.finish_round_greedy(model)
        h.check()
    raise AssertionError(f"still busy after {max_rounds} rounds")


PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12] * 7, list(range(20, 43)), [2, 3, 4]]


def draft_model(ids: list[int]) -> int:
    """A fake draft model: the fake model's token, but a different one every fourth position."""
    return model(ids) if len(ids) % 4 else (model(ids) + 1) % 60


class FakeDrafter:
    """The real DraftModel over a simulated KV memory of its pool and draft_model's logits; checks
    that the pool holds the tokens the drafter knows, and those the target's sequence has."""

    VOCAB = 64

    def __init__(self, h_config: SchedulerConfig):
        bs, self.blocks = h_config.block_size, h_config.num_blocks + 8
        self.model = DraftModel(self.blocks, bs, self.VOCAB, max_len=h_config.max_model_len, p_min=0.5,
                                token_budget=16)
        self.memory: list[list[int | None]] = [[None] * bs for _ in range(self.blocks)]
        self.harness: Harness | None = None
        self.asks = 0

    def __call__(self, ask: DraftAsk) -> DraftReply:
        self.asks += 1
        reply = self.model.propose(ask, self.run)
        assert self.harness is not None
        running = {s.seq_id: s.all_ids for s in self.harness.policy.running}
        for p in reply.proposals:
            assert self.model.states[p.seq_id].ids[: p.known] == running[p.seq_id][: p.known]
        return reply

    def run(self, chunks: list[Chunk], kind: str) -> np.ndarray:
        bs, rows = self.model.block_size, []
        for tokens, pos, table, wants in chunks:
            seq_id = next(i for i in self.model.states if self.model.alloc.block_table(i) == table)
            for i, token in enumerate(tokens):
                self.memory[table[(pos + i) // bs]][(pos + i) % bs] = token
            ids = [self.memory[table[p // bs]][p % bs] for p in range(pos + len(tokens))]
            assert ids == self.model.states[seq_id].ids[: len(ids)], f"draft KV of seq {seq_id}"
            if wants:
                row = np.zeros(self.VOCAB, np.float32)
                row[draft_model(ids)] = 20.0  # [vocab]: ~certain
                rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, self.VOCAB), np.float32)


def _serve(mode: str, **kw: int) -> Harness:
    drafter = FakeDrafter(_config(mode, **kw)) if mode == "draft" else None
    h = Harness(_config(mode, **kw), drafter=drafter)
    if drafter is not None:
        drafter.harness = h
    for i, p in enumerate(PROMPTS):
        h.add(p, max_tokens=20 + 7 * i)
    _run(h)
    return h


def test_drafted_greedy_tokens_equal_plain_ones_under_continuous_batching():
    plain, spec = _serve("off"), _serve("ngram")
    assert spec.tokens == plain.tokens and spec.finished == plain.finished
    core = spec.core
    assert core.drafted_tokens > core.accepted_tokens > 0, "drafts were made, some kept, some refused"
    assert len(spec.sent_rounds) < len(plain.sent_rounds), "kept drafts save rounds"
    assert spec.alloc.num_used_blocks == 0


def test_rejected_drafts_give_their_blocks_back_with_the_next_kv_update():
    h = Harness(_config(block_size=2))
    seq_id = h.add([9, 8, 7, 6, 5, 4, 9, 8, 7, 6, 5, 4], max_tokens=60)
    truncated, pending = 0, []
    for _ in range(200):
        if not h.start_round():
            break
        if pending:  # the round's KV update carried the truncations first
            assert h.kv_updates[-1].truncate == pending
            truncated += 1
        h.check()
        h.finish_round_greedy(model)
        h.check()
        seq = next((s for s in h.policy.running if s.seq_id == seq_id), None)
        if seq is None:
            break
        assert len(seq.block_table) <= -(-len(seq.all_ids) // 2), "a table longer than the next step needs"
        pending = list(h.core.truncations)
    assert truncated > 0
    assert h.finished == {seq_id: "length"} and len(h.tokens[seq_id]) == 60


def test_max_tokens_and_stop_tokens_cut_a_kept_draft():
    def stopping(ids: list[int]) -> int:
        return EOS if len(ids) == 30 else model(ids)

    for mode in ("off", "ngram"):
        h = Harness(_config(mode))
        capped = h.add([1, 2, 3, 1, 2, 3, 1, 2], max_tokens=13)
        stopped = h.add([4, 5, 6, 4, 5, 6, 4, 5, 6], max_tokens=50, ignore_eos=False)
        for _ in range(200):
            if not h.start_round():
                break
            h.finish_round_greedy(stopping)
            h.check()
        assert h.finished == {capped: "length", stopped: "stop"}
        assert len(h.tokens[capped]) == 13 and len(h.tokens[stopped]) == 30 - 9 + 1 and h.tokens[stopped][-1] == EOS
        if mode == "off":
            plain = h.tokens
    assert h.tokens == plain


def test_preemption_and_aborts_with_drafts_keep_outputs_exact():
    plain = _serve("off", num_blocks=24, max_running=4)
    spec = _serve("ngram", num_blocks=24, max_running=4)
    assert spec.preempted, "the small pool preempts"
    assert spec.tokens == plain.tokens and spec.finished == plain.finished
    runs = []
    for mode in ("off", "ngram"):
        h = Harness(_config(mode))
        kept, gone = h.add(PROMPTS[0], max_tokens=40), h.add(PROMPTS[1], max_tokens=40)
        _run(h, abort_at={gone: 6})
        assert h.finished == {kept: "length"} and gone in h.aborted and h.alloc.num_used_blocks == 0
        runs.append(h.tokens[kept])
    assert runs[0] == runs[1] and len(runs[0]) == 40


def test_no_drafts_past_max_batch_or_when_off():
    h = _serve("ngram", max_batch=3)  # four sequences run at first: no drafts until one ends
    first = [r for r in h.sent_rounds if len(r.seqs) == 4]
    assert first and all(s.draft == 0 for r in first for s in r.seqs)
    assert any(s.draft for r in h.sent_rounds for s in r.seqs)
    off = Harness(_config("ngram"))
    off.add(PROMPTS[1], max_tokens=20, speculative="off")  # the request turns the server's default off
    _run(off)
    assert all(s.draft == 0 for r in off.sent_rounds for s in r.seqs)


def test_ngram_drafter_proposes_what_followed_the_tail_last_time_and_adapts():
    d = NgramDrafter(SpeculationConfig(mode="ngram", max_draft=8, min_n=1, max_n=3))
    ids = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 7, 1, 2, 3]
    assert d.propose(ids, 10) == [4, 7, 1, 2]  # the most recent [1, 2, 3], four tokens (the first length)
    fresh = NgramDrafter(SpeculationConfig(mode="ngram"))
    assert fresh.propose([8, 9, 10], 5) == []  # nothing repeats
    d.verified(4, 4)
    assert d.length == 8
    d.verified(8, 2)
    assert d.length == 3
    assert d.propose(ids, 2) == [4, 7]


def test_draft_model_tokens_equal_plain_ones_under_batching_and_preemption():
    for kw in ({}, {"num_blocks": 24}):
        plain, spec = _serve("off", **kw), _serve("draft", **kw)
        assert spec.tokens == plain.tokens and spec.finished == plain.finished
        assert spec.core.drafted_tokens > spec.core.accepted_tokens > 0
        assert len(spec.sent_rounds) < len(plain.sent_rounds), "kept drafts save rounds"
        assert spec.alloc.num_used_blocks == 0
        drafter = spec.drafter
        assert isinstance(drafter, FakeDrafter)
        assert drafter.model.states == {} and drafter.model.alloc.num_used_blocks == 0, "ended sequences forgotten"
    assert spec.preempted, "the small pool preempts"


def test_draft_model_with_aborts_keeps_outputs_exact_and_frees_the_draft_pool():
    runs = []
    for mode in ("off", "draft"):
        drafter = FakeDrafter(_config(mode)) if mode == "draft" else None
        h = Harness(_config(mode), drafter=drafter)
        if drafter is not None:
            drafter.harness = h
        kept, gone = h.add(PROMPTS[0], max_tokens=40), h.add(PROMPTS[1], max_tokens=40)
        _run(h, abort_at={gone: 6})
        assert h.finished == {kept: "length"} and gone in h.aborted and h.alloc.num_used_blocks == 0
        runs.append(h.tokens[kept])
        if drafter is not None:
            assert drafter.model.alloc.num_used_blocks == 0
    assert runs[0] == runs[1] and len(runs[0]) == 40


def test_draft_pool_follows_tokens_decoded_while_drafting_paused():
    """Drafting pauses while a third sequence runs (max_batch 2) and resumes after it ends: the
    drafter's KV past the tokens both agree on is recomputed, not reused."""
    runs = []
    for mode in ("off", "draft"):
        drafter = FakeDrafter(_config(mode, max_batch=2)) if mode == "draft" else None
        h = Harness(_config(mode, max_batch=2), drafter=drafter)
        if drafter is not None:
            drafter.harness = h
        h.add(PROMPTS[0], max_tokens=60)
        h.add(PROMPTS[2], max_tokens=60)
        for n in range(500):
            if n == 4:
                h.add(PROMPTS[3], max_tokens=6)
            if not h.start_round():
                break
            h.finish_round_greedy(model)
            h.check()
        runs.append(h.tokens)
        if drafter is not None:
            assert h.core.accepted_tokens > 0 and drafter.model.alloc.num_used_blocks == 0
    assert runs[0] == runs[1]


def test_draft_model_recomputes_from_where_the_target_disagreed():
    """A proposal of three tokens, then the target's sequence goes on with other tokens (a draft
    refused, then steps decoded without asking): the catch-up recomputes from the first token
    that differs, and the pool holds the target's tokens."""
    drafter = FakeDrafter(_config("draft"))
    seen: list[list[tuple[int, int]]] = []  # per round: (position, tokens) of each chunk
    run = drafter.run

    def recording(chunks: list[Chunk], kind: str) -> np.ndarray:
        seen.append([(pos, len(tokens)) for tokens, pos, _, _ in chunks])
        return run(chunks, kind)

    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9]
    want = list(prompt)
    for _ in range(3):
        want.append(draft_model(want))
    first = drafter.model.propose(DraftAsk([DraftSeq(1, 0, prompt, limit=3)]), recording).proposals[0]
    assert (first.token_ids, first.known) == (want[11:], 11)
    assert seen == [[(0, 11)], [(11, 1)], [(12, 1)]]  # the prompt, then one-row steps
    seen.clear()
    after = [want[11], 40, 41, 42]  # the first draft token kept, the second refused, two more decoded
    second = drafter.model.propose(DraftAsk([DraftSeq(1, 11, after, limit=1)]), recording).proposals[0]
    assert second.known == 15 and len(second.token_ids) == 1
    assert seen == [[(12, 3)]], "computed again from the refused token on"
    assert drafter.model.alloc.num_used_blocks == -(-15 // 4), "blocks for the sequence's tokens, none more"
