"""The forward pass gives one answer however a round is cut and batched.

A sequence's last logits must not depend on whether its prompt was prefilled whole,
in chunks (across block boundaries), or token by token; on which other sequences share
the round; or on where its KV blocks lie in the pool. Checked on tiny models (gemma3
with a 4-token sliding window, so windows cross chunk and block edges) and on the real
SmolLM2 and Gemma 3 when pulled.
"""

from __future__ import annotations

import numpy as np
import pytest

from zinfer.devices.cpu import CpuDevice
from zinfer.devices.batch import ForwardBatch
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from tiny import write_tiny_gguf, write_tiny_hf
from zinfer.models.weights import build_weights

BLOCK = 16
N_BLOCKS = 16
TOL = 1e-4  # max |a - b| relative to max |b|


class Model:
    """A model on the CPU; each `kv()` is a fresh pool of N_BLOCKS blocks of BLOCK tokens."""

    def __init__(self, path):
        src = open_model(path)
        self.spec = src.spec
        self.dev = CpuDevice()
        self.w = build_weights(self.spec, src.tensors, self.dev.upload)

    def kv(self, noise_seed: int | None = None):
        """A fresh KV pool; with noise_seed, every slot starts as random garbage, not zeros."""
        kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, N_BLOCKS, BLOCK)
        if noise_seed is not None:
            rng = np.random.default_rng(noise_seed)
            for pool in kv.k + kv.v:
                pool[:] = rng.standard_normal(pool.shape).astype(np.float32) * 10
        return kv

    def round(self, kv, chunks) -> np.ndarray:
        """One round of (token_ids, first_position, block_table, wants_logits); logits [S, vocab]."""
        return round_logits(self.spec, self.w, self.dev, kv, ForwardBatch.build(chunks, BLOCK))

    def prefill(self, ids, table=None) -> np.ndarray:
        """Last logits [vocab] of a whole-prompt prefill into a fresh pool."""
        table = list(range(N_BLOCKS)) if table is None else table
        return self.round(self.kv(), [(ids, 0, table, True)])[0]


REAL = pytest.mark.slow  # the cached real models


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gemma3", "tiny-qwen2", pytest.param("smollm2", marks=REAL), pytest.param("gemma3", marks=REAL)])
def model(request, tmp_path_factory):
    name = request.param
    if name == "tiny-llama":
        return Model(write_tiny_gguf(tmp_path_factory.mktemp("m") / "llama.gguf", "llama"))
    if name == "tiny-gemma3":
        return Model(write_tiny_gguf(tmp_path_factory.mktemp("m") / "gemma3.gguf", "gemma3"))
    if name == "tiny-qwen2":
        return Model(write_tiny_hf(tmp_path_factory.mktemp("m") / "qwen2", "qwen2"))
    return Model(request.getfixturevalue(f"{name}_path"))


def prompt(model: Model, n: int, seed: int = 0) -> list[int]:
    """n token ids spread over the vocabulary (no tokenizer needed)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, min(model.spec.vocab_size, 20000), n)]


def assert_close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    err = float(np.abs(a - b).max() / np.abs(b).max())
    assert err < TOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("cuts", [(1,), (15,), (16,), (17,), (20,), (10, 25, 33)])
def test_chunked_prefill_equals_one_prefill(model, cuts):
    ids = prompt(model, 40)
    kv = model.kv()
    table = list(range(N_BLOCKS))
    edges = [0, *cuts, len(ids)]
    for lo, hi in zip(edges, edges[1:]):
        last = hi == len(ids)
        out = model.round(kv, [(ids[lo:hi], lo, table, last)])
        assert out.shape == ((1 if last else 0), model.spec.vocab_size)
    assert_close(out[0], model.prefill(ids))


def test_token_by_token_decode_equals_prefill(model):
    ids = prompt(model, 34, seed=1)
    kv = model.kv()
    table = list(range(N_BLOCKS))
    seen = {}
    for p, t in enumerate(ids):
        seen[p + 1] = model.round(kv, [([t], p, table, True)])[0]
    for n in (1, 16, 17, 34):  # the first token, both sides of a block edge, the end
        assert_close(seen[n], model.prefill(ids[:n]))


def test_batched_rounds_equal_each_sequence_alone(model):
    lengths = (5, 18, 33)
    seqs = [prompt(model, n + 2, seed=10 + i) for i, n in enumerate(lengths)]
    tables = [[0], [1, 2], [3, 4, 5, 6]]  # one shared pool, disjoint blocks
    kv = model.kv()
    # round 1: three prefills of different lengths in one round
    out = model.round(kv, [(s[:n], 0, t, True) for s, n, t in zip(seqs, lengths, tables)])
    assert out.shape == (3, model.spec.vocab_size)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        assert_close(out[i], model.prefill(s[:n]))
    # round 2: one decode step for each of the three
    out = model.round(kv, [(s[n : n + 1], n, t, True) for s, n, t in zip(seqs, lengths, tables)])
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        assert_close(out[i], model.prefill(s[: n + 1]))
    # round 3: two decodes next to a sequence that wants no logits this round
    out = model.round(kv, [(seqs[0][6:7], 6, tables[0], True), (seqs[1][19:20], 19, tables[1], False), (seqs[2][34:35], 34, tables[2], True)])
    assert out.shape == (2, model.spec.vocab_size)
    assert_close(out[0], model.prefill(seqs[0][:7]))
    assert_close(out[1], model.prefill(seqs[2][:35]))


def test_shuffled_block_table_equals_contiguous(model):
    ids = prompt(model, 41, seed=2)
    shuffled = [11, 3, 14]  # out of order, with gaps, over a pool of random garbage
    kv = model.kv(noise_seed=5)
    model.round(kv, [(ids[:20], 0, shuffled, False)])
    append = model.round(kv, [(ids[20:40], 20, shuffled, True)])[0]
    decode = model.round(kv, [(ids[40:], 40, shuffled, True)])[0]
    assert_close(append, model.prefill(ids[:40], table=[0, 1, 2]))
    assert_close(decode, model.prefill(ids, table=[0, 1, 2]))
