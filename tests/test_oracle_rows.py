"""The oracle's rows do not depend on the batch (kernels/oracle/reference.py, the `cpu` device).

A token's output is a function of its own row (and, in attention, of its sequence's keys
up to its position) only: computed alone, in a batch of any size, in a prefill, a chunk or
a decode step, it is the same float32 bits. So every test whose reference is the oracle
asserts exact equality between a sequence alone and batched.
"""

from __future__ import annotations

import numpy as np
import pytest

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuDevice
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.quants import BLOCK_SHAPES
from zinfer.kernels.tensor import TensorData
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights
from tiny import ARCHS, write_tiny_gguf

BATCHES = (2, 3, 8, 17)  # rows in a batch: below, at and past the BLAS kernels' tile sizes


def random_weight(qtype, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """The oracle's float32 [rows, cols] of random bytes stored as `qtype`. Every odd byte is
    masked with 0x3B, so each f32/f16/bf16 field (values, block scales) is finite and below 2."""
    epb, bpb = BLOCK_SHAPES[qtype]
    raw = rng.integers(0, 256, (rows, cols // epb * bpb), dtype=np.uint8)  # [rows, row_bytes]
    raw[:, 1::2] &= 0x3B
    return CpuDevice().upload("w", TensorData(qtype, (rows, cols), raw))


def assert_rows_alone(f, x: np.ndarray) -> None:
    """f(x)[t] equals f(x[t:t+1])[0] bit for bit, for every row t of x [n, ...]."""
    batched = f(x)
    for t in range(len(x)):
        np.testing.assert_array_equal(batched[t], f(x[t : t + 1])[0], err_msg=f"row {t} of {len(x)}")


@pytest.mark.parametrize("qtype", sorted(BLOCK_SHAPES), ids=lambda q: q.name)
def test_linear_rows_equal_each_row_alone(qtype):
    """Every accepted weight type, 300 outputs (more than one OUT_BLOCK), with and without bias."""
    rng = np.random.default_rng(int(qtype))
    w = random_weight(qtype, 300, 256, rng)
    bias = rng.standard_normal(300).astype(np.float32)
    assert np.isfinite(w).all() and np.abs(w).max() > 0
    for n in BATCHES:
        x = rng.standard_normal((n, 256)).astype(np.float32)
        assert_rows_alone(lambda rows: ref.linear(rows, w), x)
        assert_rows_alone(lambda rows: ref.linear(rows, w, bias), x)


@pytest.mark.parametrize("cols", [37, 64, 576])
def test_linear_rows_equal_each_row_alone_at_any_alignment(cols):
    """Rows of 37 floats start at every offset modulo 64 bytes; the batch's own rows may be
    strided views."""
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((520, cols)).astype(np.float32)
    x = rng.standard_normal((33, cols)).astype(np.float32)
    assert_rows_alone(lambda rows: ref.linear(rows, w), x)
    assert_rows_alone(lambda rows: ref.linear(rows, w), x[::-2])


@pytest.mark.parametrize("n_heads,n_kv,window", [(4, 4, 0), (6, 2, 0), (6, 2, 5), (9, 3, 0)])
def test_attention_queries_equal_each_decode_step(n_heads, n_kv, window):
    """A chunk of 13 queries at positions 20..32 over 40 cached keys: each query's output is
    the one it gets as a decode step (alone, over the keys up to its position)."""
    rng = np.random.default_rng(n_heads + window)
    hd, ctx = 16, 40
    q = rng.standard_normal((13, n_heads, hd)).astype(np.float32)
    k, v = (rng.standard_normal((ctx, n_kv, hd)).astype(np.float32) for _ in range(2))
    pos = np.arange(20, 33)
    chunk = ref.attention(q, k, v, pos, 0.25, window)
    for i, p in enumerate(pos):
        alone = ref.attention(q[i : i + 1], k[: p + 1], v[: p + 1], pos[i : i + 1], 0.25, window)[0]
        np.testing.assert_array_equal(chunk[i], alone, err_msg=f"query at position {p}")


class Oracle:
    """A tiny model on the oracle with its own KV pool; sequences own disjoint blocks."""

    BLOCK = 8

    def __init__(self, path):
        src = open_model(path)
        self.spec, self.dev = src.spec, CpuDevice()
        self.w = build_weights(self.spec, src.tensors, self.dev.upload)
        self.kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, 32, self.BLOCK)

    def round(self, chunks) -> np.ndarray:
        """(token_ids, first_position, block_table, wants_logits) per sequence -> logits [S, vocab]."""
        return round_logits(self.spec, self.w, self.dev, self.kv, ForwardBatch.build(chunks, self.BLOCK))


def greedy(path, prompts: dict[str, list[int]], plan: dict[str, list[int]]) -> dict[str, tuple[list, list]]:
    """Greedy rounds on a fresh oracle. plan[name][r]: how many tokens sequence `name` computes
    in round r: 0 none, n the next n of its prompt (a prefill chunk), 1 after its prompt (a
    decode step). Returns per sequence its greedy ids and their logits rows [vocab]."""
    model = Oracle(path)
    tables = {name: list(range(8 * i, 8 * i + 8)) for i, name in enumerate(prompts)}
    ids: dict[str, list[int]] = {name: [] for name in prompts}
    logits: dict[str, list[np.ndarray]] = {name: [] for name in prompts}
    cached = dict.fromkeys(prompts, 0)  # tokens in each sequence's KV cache
    for r in range(len(plan["A"])):
        chunks, takers = [], []
        for name, prompt in prompts.items():
            if n := plan[name][r]:
                first = cached[name]
                wants = first + n >= len(prompt)
                chunks.append(((prompt + ids[name])[first : first + n], first, tables[name], wants))
                takers += [name] if wants else []
                cached[name] += n
        for name, row in zip(takers, model.round(chunks), strict=True):
            ids[name].append(int(np.argmax(row)))
            logits[name].append(row)
    return {name: (ids[name], logits[name]) for name in prompts}


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decode_alone_equals_batched(tmp_path, arch):
    """Sequence A decoded alone gets the same ids and logits, bit for bit, as A prefilled in
    one round with B and decoded beside B and C, whose prompt comes in two chunks."""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch)
    rng = np.random.default_rng(7)
    prompts = {name: [int(t) for t in rng.integers(3, 250, n)] for name, n in (("A", 11), ("B", 5), ("C", 14))}
    a_plan = [11] + [1] * 9
    alone = greedy(path, {"A": prompts["A"]}, {"A": a_plan})["A"]
    batched = greedy(path, prompts, {"A": a_plan, "B": [5] + [1] * 9, "C": [0, 0, 6, 8] + [1] * 6})["A"]
    assert batched[0] == alone[0]
    for a, b in zip(batched[1], alone[1], strict=True):
        np.testing.assert_array_equal(a, b)
