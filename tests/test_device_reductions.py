"""Greedy and top-k rows leave the device as candidates, and sampling from them gives the
tokens the full row gives: the rule (logits_needed), the reduction, the sampler, and a
real engine with the reduction on and off."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.actors.executor_actor import reduce_logits
from zinfer.actors.logits_need import TOPK_CAP, logits_needed
from zinfer.actors.sampling import RequestSampler
from zinfer.devices.cpu import CpuDevice
from zinfer.kernels.oracle.topk import numpy_topk
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.codec import Codec
from zinfer.messages.engine import RoundLogits, RoundSeq, SamplerInbox
from zinfer.messages.params import Constraint, SamplingParams
from tiny import write_tiny_gguf

SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=7, max_tokens=24, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize(
    "params, need",
    [
        (GREEDY, 1),
        (SAMPLED, 40),
        (SamplingParams(top_k=1), 1),
        (SamplingParams(top_k=TOPK_CAP, min_p=0.1), TOPK_CAP),
        (SamplingParams(top_k=TOPK_CAP + 1), 0),
        (SamplingParams(temperature=0.7), 0),  # no top_k: the whole vocabulary is a candidate
        (SamplingParams(temperature=0.0, logprobs=0), 0),
        (SamplingParams(temperature=0.0, logit_bias={3: 5.0}), 0),
        (SamplingParams(temperature=0.0, repetition_penalty=1.1), 0),
        (SamplingParams(top_k=40, presence_penalty=0.5), 0),
        (SamplingParams(top_k=40, frequency_penalty=-0.5), 0),
        (SamplingParams(temperature=0.0, constraint=Constraint("regex", "[a-z]+")), 0),
        (SamplingParams(top_k=40, constraint=Constraint("choice", '["yes", "no"]')), 0),
    ],
)
def test_logits_needed(params, need):
    assert logits_needed(params) == need


def reference_topk(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (id, value) of row by a full sort: value descending, lower id first, no NaN."""
    pairs = sorted(((-float(v), i) for i, v in enumerate(row) if not np.isnan(v)))[:k]
    return [(i, -v) for v, i in pairs] + [(-1, -np.inf)] * (k - len(pairs))


@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_numpy_topk_order_ties_and_nan(k):
    rng = np.random.default_rng(k)
    rows = rng.integers(-4, 4, size=(6, 50)).astype(np.float32)  # [6, 50] many ties
    rows[1, ::3] = np.nan
    rows[2, :] = np.nan
    rows[2, 5] = -np.inf
    rows[3, 10:] = -np.inf
    ids, values = numpy_topk(rows, k)
    assert ids.shape == values.shape == (6, k) and ids.dtype == np.int64 and values.dtype == np.float32
    for r in range(6):
        assert list(zip(ids[r].tolist(), values[r].tolist())) == reference_topk(rows[r], k)


def round_seqs(needs: list[int]) -> list[RoundSeq]:
    return [RoundSeq(100 + i, [1], 0, 0, [], True, need) for i, need in enumerate(needs)]


def test_reduce_logits_ships_full_rows_only_where_asked():
    logits = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)  # [S, vocab]
    full_ids, full, cand = reduce_logits(CpuDevice(), logits, round_seqs([1, 0, 40, 300]))  # 300 >= vocab: full
    assert full_ids == [101, 103] and np.array_equal(full, logits[[1, 3]])
    assert cand.seq_ids == [100, 102] and cand.ids.shape == (2, 40)
    assert cand.ids[0, 0] == np.argmax(logits[0]) and np.array_equal(cand.ids[1], numpy_topk(logits[2], 40)[0][0])
    assert np.array_equal(cand.row_max, logits[[0, 2]].max(axis=1))
    full_ids, full, cand = reduce_logits(CpuDevice(), logits, round_seqs([1, 1, 1, 1]))
    assert full_ids == [] and full.shape == (0, 300) and cand.ids.shape == (4, 1)


def test_round_logits_with_candidates_cross_the_codec():
    logits = np.random.default_rng(1).standard_normal((3, 300)).astype(np.float32)
    full_ids, full, cand = reduce_logits(CpuDevice(), logits, round_seqs([1, 0, 8]))
    codec = Codec(SamplerInbox)
    back = codec.decode([bytes(f) for f in codec.encode(RoundLogits(5, full_ids, full, [], [], cand))])
    assert back.seq_ids == [101] and np.array_equal(back.logits, logits[[1]])
    assert back.candidates.seq_ids == [100, 102]
    assert np.array_equal(back.candidates.ids, cand.ids) and np.array_equal(back.candidates.values, cand.values)


@pytest.mark.parametrize(
    "params",
    [
        SAMPLED,
        GREEDY,
        SamplingParams(temperature=1.3, top_k=5, min_p=0.2, seed=3),
        SamplingParams(temperature=0.5, top_k=1, seed=4),
        SamplingParams(temperature=2.0, top_k=TOPK_CAP, top_p=0.5, seed=5),
    ],
)
def test_candidates_sample_the_full_rows_tokens(params):
    vocab = 1000
    rng = np.random.default_rng(11)
    full_path = RequestSampler(params, [1, 2, 3], vocab)
    cand_path = RequestSampler(params, [1, 2, 3], vocab)
    k = logits_needed(params)
    for step in range(200):
        row = (rng.standard_normal(vocab) * 3).astype(np.float32)  # [vocab]
        if step % 3 == 0:
            row = np.round(row)  # ties at the top-k boundary and inside it
        _, _, cand = reduce_logits(CpuDevice(), row[None], round_seqs([k]))
        a = full_path.sample(row).token_id
        b = cand_path.sample_candidates(cand.ids[0], cand.values[0], float(cand.row_max[0])).token_id
        assert a == b, f"step {step}"
        full_path.accept(a)
        cand_path.accept(b)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_candidates_of_a_non_finite_row_fail_as_the_full_row(bad):
    row = np.zeros(300, np.float32)
    row[7] = bad
    _, _, cand = reduce_logits(CpuDevice(), row[None], round_seqs([1]))
    with pytest.raises(ValueError, match="logits of seq 9 are not finite"):
        RequestSampler(GREEDY, [1], 300, seq_id=9).sample_candidates(cand.ids[0], cand.values[0],
                                                                     float(cand.row_max[0]))


# ---- through a real engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama")


def tap_sampler(engine) -> list[RoundLogits]:
    """The RoundLogits the engine's sampler receives from now on, in order."""
    sampler, seen = engine.actors["sampler"], []
    sample_round = sampler.sample_round

    def recording(msg: RoundLogits, *grammars):
        seen.append(msg)
        return sample_round(msg, *grammars)

    sampler.sample_round = recording
    return seen


async def generate(client: AsyncClient, prompt: str, params: SamplingParams) -> tuple[list[int], list[float] | None]:
    ids, logprobs = [], []
    async for ev in client.generate(prompt, params=params):
        if isinstance(ev, Delta):
            ids += ev.token_ids
            logprobs += ev.logprobs or []
        last = ev
    assert isinstance(last, Finished), last
    return ids, logprobs or None


async def test_engine_tokens_equal_with_and_without_reductions(tiny_model):
    async with (open_engine(EngineConfig(model=str(tiny_model), device="cpu")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        with trio.fail_after(120):
            seen = tap_sampler(engine)
            reduced = [await generate(client, "hello there world", p) for p in (SAMPLED, GREEDY)]
            assert all(m.logits.shape[0] == 0 and m.candidates is not None for m in seen)
            assert {m.candidates.ids.shape[1] for m in seen} == {40, 1}
            engine.actors["scheduler"].device_reductions = False
            seen.clear()
            full = [await generate(client, "hello there world", p) for p in (SAMPLED, GREEDY)]
            assert all(m.candidates is None and m.logits.shape[0] == 1 for m in seen)
    assert reduced == full
    assert len(set(reduced[0][0])) > 3, "the seeded request should sample varied tokens"


async def test_engine_greedy_rounds_ship_no_full_rows_and_logprobs_get_theirs(tiny_model):
    async with (open_engine(EngineConfig(model=str(tiny_model), device="cpu")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        with trio.fail_after(120):
            seen = tap_sampler(engine)
            greedy, _ = await generate(client, "zebra quartz", GREEDY)
            assert seen and all(m.logits.shape[0] == 0 and m.candidates.ids.shape == (1, 1) for m in seen)
            seen.clear()
            asks = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
            results = {}

            async def one(name: str, params: SamplingParams) -> None:
                results[name] = await generate(client, "zebra quartz", params)

            async with trio.open_nursery() as n:  # in the same rounds: one full row, one candidate row
                n.start_soon(one, "logprobs", asks)
                n.start_soon(one, "greedy", GREEDY)
    ids, logprobs = results["logprobs"]
    assert results["greedy"] == (greedy, None) and ids == greedy[:8]
    rows = [m.logits[0] for m in seen if m.logits.shape[0]]  # [vocab] each: the logprobs request's rows
    assert len(rows) == 8 and all(m.logits.shape[0] <= 1 for m in seen)
    for row, token, logprob in zip(rows, ids, logprobs):
        lse = np.log(np.exp(row.astype(np.float64) - row.max()).sum()) + row.max()
        assert logprob == pytest.approx(row[token] - lse, abs=1e-5)
