"""A draft model's proposals: its LM head cut to the first ids (a cheaper draft step) and its
stopping rule (the draft's odds that the whole proposal is kept). Fast tier: tiny random models on
the numpy `cpu` device, and DraftModel over a scripted forward.

What a user notices: greedy output with a cut head is still exactly plain decoding's; a cut head
proposes only ids it computes, sampled drafts' q is a distribution over those ids; a draft stops
before the token that would bring its odds of being kept whole under --draft-p-min."""

from __future__ import annotations

import numpy as np
import trio
from gguf import GGMLQuantizationType as QT
from gguf import quants
from msgspec.structs import replace

from test_speculative_draft import GREEDY, PROMPTS, _collect, _config, _models
from zinfer.actors.draft_head import cut_head, head_ids
from zinfer.actors.draft_model import DraftModel
from zinfer.devices.registry import make_device
from zinfer.gateway.api import EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.kernels.tensor import TensorData
from zinfer.messages.engine import DraftAsk, DraftSeq
from zinfer.messages.params import SamplingParams
from zinfer.models.loader import open_model


def test_head_ids_are_the_first_ids_and_the_end_of_generation_ids():
    ids = head_ids(100, 10, [99, 5, 300])
    assert ids is not None and ids.tolist() == list(range(10)) + [99]
    assert head_ids(100, 0, [99]) is None and head_ids(100, 100, [99]) is None


def test_a_cut_head_is_the_quantized_rows_it_keeps():
    rng = np.random.default_rng(0)
    full = rng.standard_normal((40, 64)).astype(np.float32)
    raw = quants.quantize(full, QT.Q8_0)  # [40, row bytes] uint8
    tensor = TensorData(QT.Q8_0, (40, 64), raw)
    ids = np.array([0, 1, 2, 39])
    dev = make_device("cpu")
    cut = cut_head({"token_embd.weight": tensor}, dev.upload, ids)
    whole = dev.upload("token_embd.weight", tensor)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_array_equal(dev.to_numpy(dev.linear(x, cut)), dev.to_numpy(dev.linear(x, whole))[:, ids])


def _scripted(tops: list[float], columns: int):
    """A forward whose every logits row gives column 1 probability tops[i] at the i-th row it
    returns, the rest spread evenly ([rows, columns])."""
    calls = iter(tops)

    def row(top: float) -> np.ndarray:  # [columns] log-probabilities
        p = np.full(columns, (1 - top) / (columns - 1))
        p[1] = top
        return np.log(p)

    def run(chunks, kind):
        return np.array([row(next(calls)) for *_, wants in chunks if wants], np.float32)

    return run


def test_a_draft_stops_before_its_odds_of_being_kept_whole_fall_under_p_min():
    model = DraftModel(num_blocks=8, block_size=16, vocab=50, max_len=1024, p_min=0.6)
    ask = DraftAsk([DraftSeq(1, 0, [3, 4, 5], limit=4)])
    reply = model.propose(ask, _scripted([0.8, 0.8, 0.8, 0.8], 50))
    assert reply.proposals[0].token_ids == [1, 1]  # 0.8, then 0.64; 0.512 < 0.6 is not proposed
    sure = DraftModel(num_blocks=8, block_size=16, vocab=50, max_len=1024, p_min=0.6)
    assert sure.propose(ask, _scripted([0.99] * 4, 50)).proposals[0].token_ids == [1, 1, 1, 1]


def test_a_cut_head_maps_columns_to_ids_and_samples_q_over_them():
    head = np.array([0, 7, 9, 49])
    model = DraftModel(num_blocks=8, block_size=16, vocab=50, max_len=1024, p_min=0.0, head=head)
    greedy = model.propose(DraftAsk([DraftSeq(1, 0, [3, 4], limit=2)]), _scripted([0.9, 0.9], 4))
    assert greedy.proposals[0].token_ids == [7, 7]  # column 1 is id 7
    sampled = model.propose(DraftAsk([DraftSeq(2, 0, [3, 4], limit=2, temperature=1.0, seed=3)]),
                            _scripted([0.5, 0.5], 4))
    p = sampled.proposals[0]
    assert set(p.token_ids) <= set(head.tolist()) and p.probs is not None and p.probs.shape == (2, 50)
    np.testing.assert_allclose(p.probs.sum(axis=1), 1.0, rtol=1e-5)
    assert not np.delete(p.probs, head, axis=1).any()


def test_greedy_output_with_a_cut_draft_head_equals_plain_decoding(tmp_path):
    target, draft = _models(tmp_path)
    vocab = open_model(str(target)).spec.vocab_size
    config = _config(target, draft)
    config = replace(config, speculation=replace(config.speculation, draft_head=vocab // 3))
    with EngineThread(config) as engine:
        drafter = engine.engine.actors["drafter"]
        head = set(drafter.model.head.tolist())
        assert len(head) < vocab // 2
        proposed: list[int] = []
        propose = drafter.model.propose

        def spy(ask, run):
            reply = propose(ask, run)
            proposed.extend(t for p in reply.proposals for t in p.token_ids)
            return reply

        drafter.model.propose = spy

        async def main() -> None:
            async with AsyncClient(engine.ctx, engine.address) as client:
                for prompt in PROMPTS:
                    want = (await _collect(client, prompt, GREEDY))[0]
                    got, _, _, end = await _collect(client, prompt, replace(GREEDY, speculative="draft"))
                    assert got == want, prompt
                sampled = SamplingParams(temperature=0.8, max_tokens=16, seed=7, speculative="draft")
                ids, _, _, end = await _collect(client, PROMPTS[0], sampled)
                assert len(ids) == 16

        trio.run(main)
    assert proposed and set(proposed) <= head

