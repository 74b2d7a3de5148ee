"""The sampler: greedy, seeds across batches, filters, bias, penalties, the drawn
distribution, and OpenAI-style logprobs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from zinfer.actors.sampling import RequestSampler, SampledToken, filtered_distribution, sample_batch
from zinfer.messages.params import SamplingParams

V = 64


def _logits(seed: int, vocab: int = V, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)  # [vocab]


def _sampler(prompt=(), vocab: int = V, **kw) -> RequestSampler:
    return RequestSampler(SamplingParams(**kw), list(prompt), vocab)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def _generate(sampler: RequestSampler, rows: np.ndarray) -> list[int]:
    out = []
    for row in rows:
        tok = sampler.sample(row).token_id
        sampler.accept(tok)
        out.append(tok)
    return out


def test_greedy_is_argmax_with_ties_to_lowest_id():
    s = _sampler(temperature=0.0)
    for seed in range(20):
        x = _logits(seed)
        assert s.sample(x).token_id == int(np.argmax(x))
    x = np.zeros(V, np.float32)
    x[[9, 4, 30]] = 5.0
    assert s.sample(x).token_id == 4


def test_same_seed_same_tokens_whatever_shares_the_batch():
    rows = np.stack([_logits(100 + i, scale=1.0) for i in range(30)])  # [steps, vocab]
    alone = _generate(_sampler(temperature=1.0, top_p=0.95, seed=7), rows)

    target = _sampler(temperature=1.0, top_p=0.95, seed=7)
    others = [_sampler(temperature=0.8, seed=s) for s in (1, 2)] + [_sampler(temperature=1.2)]
    batched = []
    for step, row in enumerate(rows):
        group = others[: step % 4] + [target] + others[step % 4 :]  # position and size vary
        noise = np.stack([_logits(1000 * step + j) for j in range(len(group))])  # [n, vocab]
        noise[group.index(target)] = row
        out = sample_batch(group, noise)
        tok = out[group.index(target)].token_id
        target.accept(tok)
        batched.append(tok)
    assert batched == alone


def test_different_seeds_give_different_tokens():
    rows = np.stack([_logits(i, scale=0.5) for i in range(30)])
    a = _generate(_sampler(seed=1), rows)
    b = _generate(_sampler(seed=2), rows)
    assert a != b


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_narrowest_filters_equal_greedy(filters):
    s = _sampler(temperature=1.5, seed=3, **filters)
    for seed in range(30):
        x = _logits(seed, scale=1.0)
        assert s.sample(x).token_id == int(np.argmax(x))


def _draws(s: RequestSampler, x: np.ndarray, n: int) -> np.ndarray:
    return np.bincount([s.sample(x).token_id for _ in range(n)], minlength=x.size)  # [vocab]


def test_top_p_keeps_smallest_set_reaching_the_mass():
    x = np.log(np.array([0.05, 0.5, 0.15, 0.3], np.float32))  # [vocab]
    counts = _draws(_sampler(vocab=4, top_p=0.75, seed=4), x, 1000)
    assert counts[0] == counts[2] == 0 and counts[1] > 0 and counts[3] > 0


def test_min_p_drops_tokens_below_fraction_of_max():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    counts = _draws(_sampler(vocab=4, min_p=0.2, seed=5), x, 2000)  # floor 0.1
    assert counts[3] == 0 and (counts[:3] > 0).all()


def test_top_k_keeps_k_most_likely():
    x = _logits(6, scale=0.3)
    counts = _draws(_sampler(top_k=3, seed=6), x, 1500)
    assert set(np.flatnonzero(counts)) == set(np.argsort(-x)[:3])


def test_logit_bias_forces_and_bans():
    x = _logits(7)
    forced = int(np.argmin(x))
    assert {_sampler(logit_bias={forced: 100.0}, seed=s).sample(x).token_id for s in range(20)} == {forced}
    top = int(np.argmax(x))
    banned = _sampler(vocab=V, logit_bias={top: -100.0}, seed=8)
    assert _draws(banned, x, 300)[top] == 0
    assert _sampler(temperature=0.0, logit_bias={top: -100.0}).sample(x).token_id == int(np.argsort(-x)[1])


def test_presence_and_frequency_penalties_demote_generated_tokens():
    x = np.zeros(V, np.float32)
    x[3], x[5] = 2.0, 1.5  # token 3 leads by 0.5
    plain = _sampler(temperature=0.0)
    plain.accept(3)
    assert plain.sample(x).token_id == 3
    presence = _sampler(temperature=0.0, presence_penalty=1.0)
    presence.accept(3)
    assert presence.sample(x).token_id == 5
    freq = _sampler(temperature=0.0, frequency_penalty=0.3)
    freq.accept(3)
    assert freq.sample(x).token_id == 3  # 0.3 < 0.5
    freq.accept(3)
    assert freq.sample(x).token_id == 5  # 0.6 > 0.5
    prompt_only = _sampler(prompt=[3, 3, 3], temperature=0.0, presence_penalty=1.0)
    assert prompt_only.sample(x).token_id == 3  # presence counts generated tokens only


@pytest.mark.parametrize("lead,rival", [(2.0, 1.5), (-1.0, -1.2)])
def test_repetition_penalty_covers_prompt_and_both_signs(lead, rival):
    x = np.full(V, -5.0, np.float32)
    x[3], x[5] = lead, rival
    assert _sampler(prompt=[3], temperature=0.0).sample(x).token_id == 3
    assert _sampler(prompt=[3], temperature=0.0, repetition_penalty=1.5).sample(x).token_id == 5
    generated = _sampler(temperature=0.0, repetition_penalty=1.5)
    assert generated.sample(x).token_id == 3
    generated.accept(3)
    assert generated.sample(x).token_id == 5


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_empirical_frequencies_match_softmax(temperature):
    vocab, n = 8, 4000
    x = _logits(9, vocab=vocab, scale=1.0)
    counts = _draws(_sampler(vocab=vocab, temperature=temperature, seed=10), x, n)
    expected = n * np.exp(_log_softmax(x / temperature))
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_logprobs_are_raw_log_softmax_with_sorted_top_n():
    x = _logits(11)
    s = _sampler(prompt=[1, 2], temperature=0.7, top_k=5, repetition_penalty=1.3, logprobs=5, seed=12)
    out = s.sample(x)
    ref = _log_softmax(x)
    assert out.logprob == pytest.approx(ref[out.token_id], abs=1e-5)
    assert [t for t, _ in out.top_logprobs] == list(np.argsort(-x)[:5])
    assert [lp for _, lp in out.top_logprobs] == pytest.approx(sorted(ref, reverse=True)[:5], abs=1e-5)
    assert _sampler().sample(x).top_logprobs is None
    assert _sampler(logprobs=0).sample(x).top_logprobs == []


def test_logprob_is_computed_only_when_asked_for():
    x = _logits(15)
    greedy = _sampler(temperature=0.0, logprobs=0).sample(x)
    assert greedy.logprob == pytest.approx(_log_softmax(x).max(), abs=1e-5)
    assert _sampler(temperature=0.0).sample(x).logprob is None
    assert _sampler(temperature=0.8, seed=3).sample(x).logprob is None


def test_input_logits_are_not_mutated():
    x = _logits(13)
    before = x.copy()
    s = _sampler(prompt=[0, 1], logit_bias={2: 5.0}, repetition_penalty=1.2, presence_penalty=0.5, seed=1)
    s.accept(4)
    s.sample(x)
    sample_batch([s], x[None, :])
    np.testing.assert_array_equal(x, before)


def test_invalid_logits_raise():
    x = _logits(14)
    x[7] = np.nan
    with pytest.raises(ValueError):
        _sampler().sample(x)
    with pytest.raises(ValueError):
        _sampler(temperature=0.0).sample(x)
    for bad in (np.inf, -np.inf):
        y = _logits(14)
        y[7] = bad
        if bad == -np.inf:
            y[:] = bad
        for temperature in (0.0, 0.7):
            with pytest.raises(ValueError):
                _sampler(temperature=temperature).sample(y)
    with pytest.raises(ValueError):
        sample_batch([_sampler()], np.stack([_logits(1), _logits(2)]))  # 2 rows, 1 sampler
    with pytest.raises(ValueError):
        _sampler(prompt=[V])  # prompt id outside the vocabulary


def test_sampled_token_round_trips_through_msgpack():
    import msgspec

    tok = SampledToken(token_id=5, logprob=-0.25, top_logprobs=[(5, -0.25), (2, -1.5)])
    data = msgspec.msgpack.encode(tok)
    assert msgspec.msgpack.decode(data, type=SampledToken) == tok


def _reference(z, temperature, top_k, top_p, min_p) -> dict[int, float]:
    """Straightforward full-sort version of the filters: token -> probability."""
    p = np.exp(_log_softmax(z.astype(np.float64) / temperature))
    order = np.argsort(-p, kind="stable")
    if top_k:
        order = order[:top_k]
    q = p[order] / p[order].sum()
    if top_p < 1.0:
        n = int(np.searchsorted(np.cumsum(q), top_p)) + 1
        order, q = order[:n], q[:n]
    if min_p > 0.0:
        keep = q >= min_p * q.max()
        order, q = order[keep], q[keep]
    return dict(zip(order.tolist(), (q / q.sum()).tolist()))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.sampled_from([5, 50, 2000]),
    temperature=st.sampled_from([0.3, 1.0, 2.0]),
    top_k=st.sampled_from([0, 1, 3, 40, 1000]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)
# flat distributions over vocabularies larger than the nucleus probe: the widening search
@example(seed=0, vocab=2000, temperature=2.0, top_k=0, top_p=0.9, min_p=0.0)
@example(seed=1, vocab=40_000, temperature=2.0, top_k=0, top_p=0.5, min_p=0.0)
@example(seed=2, vocab=40_000, temperature=0.3, top_k=0, top_p=0.9, min_p=0.0)
def test_filtered_distribution_matches_full_sort_reference(seed, vocab, temperature, top_k, top_p, min_p):
    z = _logits(seed, vocab=vocab, scale=2.0)
    ids, probs = filtered_distribution(z, temperature, top_k, top_p, min_p)
    got = dict(zip(ids.tolist(), probs.tolist()))
    want = _reference(z, temperature, top_k, top_p, min_p)
    assert got.keys() == want.keys()
    assert [got[k] for k in want] == pytest.approx(list(want.values()), rel=1e-9, abs=1e-12)
