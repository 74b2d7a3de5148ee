"""Speculative decoding end to end on a tiny random llama (fast tier) and on the real SmolLM2 (slow):
greedy outputs (tokens and logprobs) equal plain decoding's, with stop strings, stop tokens and a
grammar; drafted and accepted counts reach usage and engine stats. And the accept/resample rule
keeps the sampled distribution: a chi-square test on the tiny model's logits over many seeds."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import trio
from msgspec.structs import replace
from scipy.stats import binomtest, chisquare

from tiny import write_tiny_gguf
from zinfer.actors.sampling import RequestSampler
from zinfer.actors.speculation import SpeculationConfig
from zinfer.actors.speculation_verify import full_row_sampler, verify_rows
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.registry import make_device
from zinfer.actors.engine import open_engine
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.cli import main as cli_main
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.openai_schema import ApiError, ChatRequest, CompletionRequest, parse, sampling_params
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import Constraint, SamplingParams
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weight_cache import build_device_weights
from zinfer.traces.check import check_trace
from zinfer.traces.config import TraceConfig
from zinfer.traces.merge import merge_parts
from zinfer.traces.parts import part_files

# prompts whose text repeats, so prompt lookup finds drafts
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "the cat sat on the mat; the cat sat on the",
    "one two three four one two three four one two",
]


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def engine(request, tmp_path_factory):
    if request.param == "tiny":
        path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=1024)
    else:
        path = request.getfixturevalue("smollm2_path")
    config = EngineConfig(model=str(path), device="cpu", max_running=8, num_blocks=256,
                          speculation=SpeculationConfig(mode="ngram"))
    with EngineThread(config) as e:
        yield e, PROMPTS if request.param == "tiny" else PROMPTS[2:]  # the real model: one prompt, lean


async def _collect(client: AsyncClient, prompt: str, params: SamplingParams) -> tuple[list[int], list[float], object]:
    ids: list[int] = []
    logprobs: list[float] = []
    terminal = None
    async for ev in client.generate(prompt, params=params):
        if isinstance(ev, Delta):
            ids += ev.token_ids
            logprobs += ev.logprobs or []
        terminal = ev
    return ids, logprobs, terminal


async def test_greedy_with_drafts_equals_plain_decoding(engine):
    engine, prompts = engine
    async with AsyncClient(engine.ctx, engine.address) as client:
        before = await client.stats()
        drafted = accepted = 0
        for prompt in prompts:
            for extra in ({}, {"logprobs": 2}, {"stop": ["the"]}):
                plain = SamplingParams(temperature=0.0, max_tokens=24, speculative="off", **extra)
                want, want_lp, _ = await _collect(client, prompt, plain)
                got, got_lp, end = await _collect(client, prompt, replace(plain, speculative=None))  # the server's
                assert got == want, (prompt, extra)
                np.testing.assert_allclose(got_lp, want_lp, atol=2e-4)
                assert isinstance(end, Finished)
                drafted += end.usage.drafted_tokens
                accepted += end.usage.accepted_tokens
        stats = await client.stats()
        assert stats.drafted_tokens - before.drafted_tokens == drafted
        assert stats.accepted_tokens - before.accepted_tokens == accepted
        assert drafted > 0 and accepted > 0, "the repeating prompts were drafted and some drafts kept"


async def test_constrained_and_concurrent_requests_with_drafts_equal_plain(engine):
    engine, prompts = engine
    choice = Constraint("choice", '["the cat sat on the mat", "the cat sat on the hat"]')
    async with AsyncClient(engine.ctx, engine.address) as client:
        plain = SamplingParams(temperature=0.0, max_tokens=16, speculative="off", constraint=choice)
        want, _, _ = await _collect(client, PROMPTS[1], plain)
        got, _, _ = await _collect(client, PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=16,
                                                                        constraint=choice))
        assert got == want
        singles = {p: (await _collect(client, p, SamplingParams(temperature=0.0, max_tokens=20)))[0]
                   for p in prompts}
        results: dict[int, list[int]] = {}
        k = len(prompts)

        async def one(i: int) -> None:
            results[i] = (await _collect(client, prompts[i % k], SamplingParams(temperature=0.0, max_tokens=20)))[0]

        async with trio.open_nursery() as n:
            for i in range(2 * k):
                n.start_soon(one, i)
        assert all(results[i] == singles[prompts[i % k]] for i in range(2 * k))


def test_accept_resample_keeps_the_sampled_distribution(tmp_path):
    """Row 0 and row 1 of a drafted round on the tiny model: over many seeds, the first token follows
    softmax(row 0) and, after the draft's first token was kept, the second follows softmax(row 1)."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    source = open_model(str(path))
    dev = make_device("cpu")
    spec, w = source.spec, build_device_weights(source, dev)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 4, 16)
    prompt = [5, 17, 99, 42, 7]
    batch = ForwardBatch.build([(prompt, 0, [0], True)], 16)
    p0 = _softmax(round_logits(spec, w, dev, kv, batch)[0] / 0.3)
    draft = [int(np.argsort(p0)[-2]), 11]  # the second likeliest: kept about p0[d] of the time
    rows_batch = ForwardBatch.build([(prompt + draft, 0, [0], True)], 16)
    rows = round_logits(spec, w, dev, kv, _all_rows(rows_batch, 3))  # [3, vocab]: after prompt, +d0, +d0 d1
    params = SamplingParams(temperature=0.3)
    firsts, seconds = [], []
    for seed in range(6000):
        sampler = RequestSampler(replace(params, seed=seed), prompt, spec.vocab_size)
        kept = verify_rows(sampler, draft, full_row_sampler(sampler, rows))
        firsts.append(kept[0].token_id)
        if kept[0].token_id == draft[0]:
            seconds.append(kept[1].token_id)
    p1 = _softmax(rows[1] / 0.3)
    for tokens, p in ((firsts, _softmax(rows[0] / 0.3)), (seconds, p1)):
        observed, expected = _binned(np.bincount(tokens, minlength=spec.vocab_size), p * len(tokens))
        assert chisquare(observed, expected).pvalue > 1e-3
    assert binomtest(len(seconds), len(firsts), float(p0[draft[0]])).pvalue > 1e-3  # d0 kept with probability p(d0)


def _all_rows(batch: ForwardBatch, n: int) -> ForwardBatch:
    return dataclasses.replace(batch, logits_rows=np.arange(batch.n_tokens - n, batch.n_tokens, dtype=np.int64))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z.astype(np.float64) - z.max())
    return e / e.sum()


def _binned(observed: np.ndarray, expected: np.ndarray, least: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Tokens expected at least `least` times each keep their bin; the rest share one (chi-square's rule)."""
    big = expected >= least
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return obs, exp * obs.sum() / exp.sum()


def test_the_openai_field_and_the_server_flag_choose_drafts_and_refuse_others():
    body = b'{"messages": [{"role": "user", "content": "hi"}], "speculative": "ngram"}'
    assert sampling_params(parse(body, ChatRequest), 64).speculative == "ngram"
    assert sampling_params(parse(b'{"prompt": "x"}', CompletionRequest), 64).speculative is None  # the server's
    with pytest.raises(ApiError) as bad:
        sampling_params(parse(body.replace(b'"ngram"', b'"eagle"'), ChatRequest), 64)
    assert bad.value.status == 400 and bad.value.param == "speculative"
    with pytest.raises(ValueError, match="speculation mode"):
        EngineConfig(speculation=SpeculationConfig(mode="medusa"))


async def test_draft_and_verify_spans_in_the_trace(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    config = EngineConfig(model=str(path), device="cpu", speculation=SpeculationConfig(mode="ngram"),
                          trace=TraceConfig(dir=str(tmp_path / "trace")))
    async with open_engine(config) as engine:
        async with AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            _, _, end = await _collect(client, PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=16))
    assert isinstance(end, Finished) and end.usage.drafted_tokens > 0
    doc = merge_parts(part_files(tmp_path / "trace"))
    assert check_trace(doc) == []
    events = [e for e in doc["traceEvents"] if e["ph"] == "X" and "trace_id" in e.get("args", {})]  # spans, not mirrors
    drafts = [e for e in events if e["name"] == "draft"]
    verifies = [e for e in events if e["name"].endswith("verify") and e["args"].get("drafted_tokens")]
    assert drafts and sum(sum(e["args"]["drafted_tokens"]) for e in drafts) == end.usage.drafted_tokens
    assert len(verifies) == len(drafts)


def test_zinfer_bench_speculate_adds_speculative_rows(capsys, tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    argv = ["bench", "--model", str(path), "--device", "cpu", "--prefill-len", "16", "--prefill-requests", "1",
            "--prompt-len", "16", "--output-len", "12", "--decode-requests", "1", "--streams", "2",
            "--bandwidth-mib", "0", "--speculate", "ngram", "--json"]
    with pytest.raises(SystemExit) as done:
        cli_main(argv)
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    report = json.loads(out.out)
    labels = {r["label"]: r for r in report["rows"]}
    assert labels["decode, batch 1, speculative ngram"]["zinfer"] > 0
    assert labels["2 streams, end to end, speculative ngram"]["zinfer"] > 0
    assert report["zinfer"]["streams_2_spec"]["tokens"] == report["zinfer"]["streams_2"]["tokens"] == 24
    assert report["zinfer"]["speculation"]["drafted_tokens"] >= report["zinfer"]["speculation"]["accepted_tokens"]
