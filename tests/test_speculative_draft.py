"""Speculative decoding with a draft model, as a user notices it (fast tier: tiny random models on the
numpy `cpu` device). The draft is the target's first layer (same seed, one layer: same vocabulary,
drafts often right and often wrong), so rounds keep some drafts and cut others.

Greedy outputs equal plain decoding's token for token (and logprob for logprob), alone and under
continuous batching, with stop strings and max_tokens; a cancelled request frees its KV in both
pools; sampled requests use the draft's q; a draft model with another vocabulary is refused at
start; the accept/resample rule with q keeps the target's distribution (chi-square over seeds);
the drafter's rounds are spans of their own in the trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import trio
from msgspec.structs import replace
from scipy.stats import binomtest, chisquare

from test_speculative import _binned, _softmax
from tiny import write_tiny_gguf
from zinfer.actors.draft_vocab import VocabMismatch
from zinfer.actors.front_door_requests import Choice
from zinfer.actors.engine import open_engine
from zinfer.actors.sampling import RequestSampler
from zinfer.actors.scheduler_policy import SchedulerConfig, SchedulerPolicy, Seq
from zinfer.actors.speculation import SpeculationConfig
from zinfer.actors.speculation_verify import full_row_sampler, verify_rows
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.registry import make_device
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.cli import main as cli_main
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder
from zinfer.models.weight_cache import build_device_weights
from zinfer.traces.check import check_trace
from zinfer.traces.config import TraceConfig
from zinfer.traces.merge import merge_parts
from zinfer.traces.parts import part_files

PROMPTS = ["the cat sat on the mat", "one two three", "def add(a, b):\n    return a + b\n", "in the end"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, speculative="off")


def _models(tmp: Path) -> tuple[Path, Path]:
    target = write_tiny_gguf(tmp / "target.gguf", "llama", max_position_embeddings=1024)
    draft = write_tiny_gguf(tmp / "draft.gguf", "llama", max_position_embeddings=1024, num_hidden_layers=1)
    return target, draft


def _config(target: Path, draft: Path, **kw: object) -> EngineConfig:
    spec = SpeculationConfig(mode="draft", draft_model=str(draft), draft_p_min=0.0, draft_max=4)
    return EngineConfig(model=str(target), device="cpu", max_running=8, num_blocks=256, speculation=spec, **kw)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    target, draft = _models(tmp_path_factory.mktemp("draft"))
    with EngineThread(_config(target, draft)) as e:
        yield e


async def _collect(client: AsyncClient, prompt: str, params: SamplingParams
                   ) -> tuple[list[int], list[float], str, object]:
    ids: list[int] = []
    logprobs: list[float] = []
    text, terminal = "", None
    async for ev in client.generate(prompt, params=params):
        if isinstance(ev, Delta):
            ids += ev.token_ids
            logprobs += ev.logprobs or []
            text += ev.text
        terminal = ev
    return ids, logprobs, text, terminal


async def test_greedy_with_a_draft_model_equals_plain_decoding(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        before = await client.stats()
        drafted = accepted = 0
        for prompt in PROMPTS[:2]:
            want, want_lp, text, _ = await _collect(client, prompt, replace(GREEDY, logprobs=2))
            stop = text[len(text) // 2 : len(text) // 2 + 2]  # cut mid-output, where a draft may run past it
            for extra in ({"logprobs": 2}, {"stop": [stop]}, {"max_tokens": 5}):
                plain = replace(GREEDY, **extra)
                want, want_lp, want_text, want_end = await _collect(client, prompt, plain)
                got, got_lp, got_text, end = await _collect(client, prompt, replace(plain, speculative=None))
                assert (got, got_text) == (want, want_text), (prompt, extra)
                np.testing.assert_allclose(got_lp, want_lp, atol=2e-4)
                assert isinstance(end, Finished) and isinstance(want_end, Finished)
                assert end.finish_reasons == want_end.finish_reasons and end.usage.completion_tokens == len(want)
                drafted += end.usage.drafted_tokens
                accepted += end.usage.accepted_tokens
        stats = await client.stats()
        assert (stats.drafted_tokens - before.drafted_tokens, stats.accepted_tokens - before.accepted_tokens) == (
            drafted, accepted)
        assert drafted > accepted > 0, "the one-layer draft is right sometimes and wrong sometimes"


async def test_batched_draft_requests_equal_their_plain_outputs(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        singles = {p: (await _collect(client, p, GREEDY))[0] for p in PROMPTS}
        results: dict[int, list[int]] = {}

        async def one(i: int) -> None:
            params = replace(GREEDY, speculative="draft", max_tokens=24 - i)  # they end at different rounds
            results[i] = (await _collect(client, PROMPTS[i % len(PROMPTS)], params))[0]

        async with trio.open_nursery() as n:
            for i in range(6):
                n.start_soon(one, i)
        assert all(results[i] == singles[PROMPTS[i % len(PROMPTS)]][: 24 - i] for i in range(6))


async def test_cancelled_draft_request_frees_both_pools_and_the_engine_serves_on(engine):
    drafter = engine.engine.actors["drafter"]
    async with AsyncClient(engine.ctx, engine.address) as client:
        events = []
        async for ev in client.generate(PROMPTS[0], params=replace(GREEDY, speculative="draft", max_tokens=400)):
            events.append(ev)
            if len(events) == 3:
                break  # leaving the stream cancels the request
        after, _, _, end = await _collect(client, PROMPTS[1], replace(GREEDY, speculative="draft"))
        assert isinstance(end, Finished) and after == (await _collect(client, PROMPTS[1], GREEDY))[0]
        with trio.fail_after(5):
            while (await client.stats()).kv_used_blocks or drafter.model.alloc.num_used_blocks:
                await trio.sleep(0.01)
        assert drafter.model.states == {}


async def test_sampled_requests_draft_from_q(engine):
    async with AsyncClient(engine.ctx, engine.address) as client:
        params = SamplingParams(temperature=0.8, max_tokens=16, seed=7, speculative="draft")
        ids, _, _, end = await _collect(client, PROMPTS[0], params)
        assert isinstance(end, Finished) and len(ids) == 16 and end.usage.drafted_tokens > 0


def test_a_draft_model_with_another_vocabulary_is_refused_at_start(tmp_path):
    target, _ = _models(tmp_path)
    other = write_tiny_gguf(tmp_path / "other.gguf", "llama", num_hidden_layers=1,
                            metadata={"tokenizer.ggml.eos_token_id": 2})

    async def start() -> None:
        async with open_engine(_config(target, other)):
            pass

    with pytest.raises(VocabMismatch, match="EOS is 2, the target's 1"):
        trio.run(start)


def test_draft_requests_need_a_server_with_a_draft_model():
    policy = SchedulerPolicy(SchedulerConfig(speculation=SpeculationConfig(mode="ngram")))
    seq = Seq(1, [5, 6, 7], SamplingParams(speculative="draft"), frozenset([1]))
    code, why = policy.add(seq) or ("", "")
    assert code == "bad_request" and "--draft-model" in why
    with pytest.raises(ValueError, match="needs a draft model"):
        EngineConfig(speculation=SpeculationConfig(mode="draft"))


def test_accept_resample_with_the_draft_models_q_keeps_the_sampled_distribution(tmp_path):
    """Drafts drawn from the draft model's q: over many seeds the first token follows the target's
    softmax(row 0), and, after a kept draft, the second follows softmax(row 1); a draft is kept
    with probability sum(min(p, q)) (a point-mass rule would keep it with sum(p q): also exact,
    but fewer drafts kept)."""
    target, draft = _models(tmp_path)
    dev = make_device("cpu")
    prompt, t = [5, 17, 99, 42, 7], 0.5

    def rows(path: Path, ids: list[int], n: int) -> np.ndarray:  # [n, vocab]: logits after ids[:-n+1], ...
        source = open_model(str(path))
        spec, w = source.spec, build_device_weights(source, dev)
        kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 4, 16)
        batch = ForwardBatch.build([(ids, 0, [0], True)], 16)
        batch = dataclasses.replace(batch, logits_rows=np.arange(len(ids) - n, len(ids), dtype=np.int64))
        return round_logits(spec, w, dev, kv, batch)

    q0 = _softmax(rows(draft, prompt, 1)[0] / t)
    d0 = int(np.argmax(rows(target, prompt, 1)[0]))  # the target's likeliest: often kept
    q1 = _softmax(rows(draft, prompt + [d0], 1)[0] / t)
    p_rows = rows(target, prompt + [d0, 0], 3)  # after the prompt, after d0 (row 2 is never checked)
    params = SamplingParams(temperature=t)
    draws = np.random.default_rng(123)
    firsts, seconds, kept_drafts = [], [], 0
    for seed in range(3000):
        sampler = RequestSampler(replace(params, seed=seed), prompt, len(q0))
        d = int(draws.choice(len(q0), p=q0))
        firsts.append(full_row_sampler(sampler, p_rows, q0[None].astype(np.float32))(0, d).token_id)
        kept_drafts += firsts[-1] == d
        # row 0 drafts d0 as a point mass (q one-hot), row 1 draws d1 from q1
        q = np.stack([np.eye(len(q0))[d0], q1]).astype(np.float32)  # [2, vocab]
        kept = verify_rows(sampler, [d0, int(draws.choice(len(q1), p=q1))], full_row_sampler(sampler, p_rows, q))
        if kept[0].token_id == d0:
            seconds.append(kept[1].token_id)
    for tokens, p in ((firsts, _softmax(p_rows[0] / t)), (seconds, _softmax(p_rows[1] / t))):
        observed, expected = _binned(np.bincount(tokens, minlength=len(q0)), p * len(tokens))
        assert chisquare(observed, expected).pvalue > 1e-3
    assert len(seconds) > 200
    p0 = _softmax(p_rows[0] / t)
    assert binomtest(kept_drafts, len(firsts), float(np.minimum(p0, q0).sum())).pvalue > 1e-3


async def test_draft_rounds_are_spans_of_their_own(tmp_path):
    target, draft = _models(tmp_path)
    async with open_engine(_config(target, draft, trace=TraceConfig(dir=str(tmp_path / "trace")))) as engine:
        async with AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            _, _, _, end = await _collect(client, PROMPTS[0], replace(GREEDY, speculative=None, max_tokens=12))
    assert isinstance(end, Finished) and end.usage.drafted_tokens > 0
    doc = merge_parts(part_files(tmp_path / "trace"))
    assert check_trace(doc) == []
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and "trace_id" in e.get("args", {})]
    names = {e["name"] for e in spans}
    assert {"draft_append", "draft_decode"} <= names and any(n.endswith("verify") for n in names)
    assert all(e["args"].get("zinfer.actor") == "drafter" for e in spans if e["name"].startswith("draft_"))



def test_zinfer_bench_speculate_draft_adds_draft_model_rows_and_needs_a_draft_model(capsys, tmp_path):
    target, draft = _models(tmp_path)
    argv = ["bench", "--model", str(target), "--device", "cpu", "--prefill-len", "16", "--prefill-requests", "1",
            "--prompt-len", "16", "--output-len", "12", "--decode-requests", "1", "--streams", "2",
            "--bandwidth-mib", "0", "--speculate", "draft", "--json"]
    with pytest.raises(SystemExit) as refused:
        cli_main(argv)
    assert refused.value.code == 1 and "needs a draft model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        cli_main(argv + ["--draft-model", str(draft), "--draft-p-min", "0"])
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    report = json.loads(out.out)
    labels = {r["label"]: r for r in report["rows"]}
    assert labels["decode, batch 1, speculative draft"]["zinfer"] > 0
    assert report["zinfer"]["streams_2_spec"]["tokens"] == report["zinfer"]["streams_2"]["tokens"] == 24
    assert report["zinfer"]["speculation"]["drafted_tokens"] > report["zinfer"]["speculation"]["accepted_tokens"] > 0


def test_a_stop_string_inside_a_multi_token_output_drops_the_tokens_after_it(tmp_path):
    """Kept drafts arrive as several tokens at once: the choice ends at the token that completes the
    stop string, as one token at a time would end it."""
    tokenizer = PromptBuilder.from_source(open_model(str(_models(tmp_path)[0]))).tokenizer
    bang, a = tokenizer.token_to_id("!"), tokenizer.token_to_id("a")
    assert bang is not None and a is not None
    choice = Choice(1, IncrementalDetokenizer(tokenizer), StopMatcher(["!!"]))
    assert choice.feed([a], None) == ("a", None, 1)
    assert choice.feed([bang, bang, bang, a], None) == ("", "stop", 2)
    assert choice.tokens == 3


async def test_a_failing_draft_round_costs_only_its_drafts(engine):
    """The draft model's device fails for a while: the asked sequences decode without drafts, with
    the same tokens, and the drafter starts them over once it works again."""
    drafter = engine.engine.actors["drafter"]
    calls = []

    def broken(ask, run):
        calls.append(ask)
        raise RuntimeError("draft device fault")

    async with AsyncClient(engine.ctx, engine.address) as client:
        want = (await _collect(client, PROMPTS[2], GREEDY))[0]
        drafter.model.propose = broken  # the instance's, for a while
        try:
            got, _, _, end = await _collect(client, PROMPTS[2], replace(GREEDY, speculative="draft"))
        finally:
            del drafter.model.propose
        assert got == want and isinstance(end, Finished) and calls and end.usage.drafted_tokens == 0
        again, _, _, end = await _collect(client, PROMPTS[2], replace(GREEDY, speculative="draft"))
        assert again == want and end.usage.drafted_tokens > 0
