"""The forward pass gives one answer however a round is cut and batched, on every CPU device.

A sequence's last logits must not depend on whether its prompt was prefilled whole,
in chunks (across block boundaries), or token by token; on which other sequences share
the round; or on where its KV blocks lie in the pool. Checked on tiny models (gemma3
with a 4-token sliding window, so windows cross chunk and block edges; Q8_0 GGUF
weights so cpu-fast's int8 and quantized kernels run) on the oracle, cpu-llama and
cpu-fast (int8 on and off, K/V in f16 and f32), and on the real SmolLM2 and Gemma 3 on
the oracle when pulled. Each device is held to its own tolerance against itself, and
the greedy id must not move. Then the round's context: built once per executor round,
the same object for every layer.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
import zmq
from gguf import GGMLQuantizationType as QT

from zinfer.actors.executor_actor import ExecutorActor
from zinfer.actors.topology import Addresses
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.devices.cpu_llama import LlamaCpuDevice
from zinfer.messages.engine import Round, RoundSeq
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from tiny import write_tiny_gguf, write_tiny_hf
from zinfer.models.weights import build_weights
from zinfer.traces.config import TraceConfig
from zinfer.traces.setup import Tracing

BLOCK = 16
N_BLOCKS = 16
# device -> (constructor, max |a - b| relative to max |b| between two cuts of one round)
DEVICES = {
    "cpu": (CpuDevice, 0.0),  # the oracle: a row's numbers never depend on the round (test_oracle_rows.py)
    "cpu-llama": (LlamaCpuDevice, 1e-5),
    # int8 where the CPU has VNNI. Chunk and paged attention sum in different orders (~1e-7);
    # over f16 K/V that can push one value across an f16 rounding edge and then one int8
    # activation across a code edge, which moves every later logit: up to 1.25e-2 over 12
    # prompts, median 2e-7. The cut machinery itself is the same code as int8-f32kv and
    # float-f16kv below, and those hold 1e-4.
    "cpu-fast-int8-f16kv": (lambda: FastCpuDevice(int8=True, kv_f16=True), 3e-2),
    "cpu-fast-int8-f32kv": (lambda: FastCpuDevice(int8=True, kv_f16=False), 1e-4),
    "cpu-fast-float-f16kv": (lambda: FastCpuDevice(int8=False, kv_f16=True), 1e-4),
    "cpu-fast-float-f32kv": (lambda: FastCpuDevice(int8=False, kv_f16=False), 1e-4),
}
# heads of 64: llama.cpp's dot products (kernels/llama_cpp/llama_ops.py) run in 64-value steps
SHAPE = dict(hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64)


class Model:
    """A model on one device; each `kv()` is a fresh pool of N_BLOCKS blocks of BLOCK tokens."""

    def __init__(self, path, device: str = "cpu"):
        src = open_model(path)
        make, self.tol = DEVICES[device]
        self.spec = src.spec
        self.dev = make()
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
TINY = [("tiny-llama", d) for d in DEVICES] + [("tiny-gemma3", d) for d in DEVICES] + [("tiny-qwen2", "cpu")]
CASES = [pytest.param(c, id="-".join(c)) for c in TINY] + [pytest.param((m, "cpu"), id=m, marks=REAL)
                                                           for m in ("smollm2", "gemma3")]


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    return {
        "tiny-llama": write_tiny_gguf(d / "llama.gguf", "llama", qtype=QT.Q8_0, **SHAPE),
        "tiny-gemma3": write_tiny_gguf(d / "gemma3.gguf", "gemma3", qtype=QT.Q8_0, **SHAPE),
        "tiny-qwen2": write_tiny_hf(d / "qwen2", "qwen2"),
    }


@pytest.fixture(scope="module", params=CASES)
def model(request, tiny_paths):
    name, device = request.param
    path = tiny_paths[name] if name in tiny_paths else request.getfixturevalue(f"{name}_path")
    return Model(path, device)


def prompt(model: Model, n: int, seed: int = 0) -> list[int]:
    """n token ids spread over the vocabulary (no tokenizer needed)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, min(model.spec.vocab_size, 20000), n)]


def assert_same(model: Model, a: np.ndarray, b: np.ndarray) -> None:
    """a and b [vocab] within the device's tolerance, with the same greedy id."""
    assert a.shape == b.shape
    err = float(np.abs(a - b).max() / np.abs(b).max())
    assert err <= model.tol, f"relative error {err:.2e}"
    assert int(np.argmax(a)) == int(np.argmax(b))


@pytest.mark.parametrize("cuts", [(1,), (16,), (17,), (10, 25, 33)])  # block edges, and chunks across them
def test_chunked_prefill_equals_one_prefill(model, cuts):
    ids = prompt(model, 40)
    kv = model.kv()
    table = list(range(N_BLOCKS))
    edges = [0, *cuts, len(ids)]
    for lo, hi in zip(edges, edges[1:]):
        last = hi == len(ids)
        out = model.round(kv, [(ids[lo:hi], lo, table, last)])
        assert out.shape == ((1 if last else 0), model.spec.vocab_size)
    assert_same(model, out[0], model.prefill(ids))


def test_token_by_token_decode_equals_prefill(model):
    ids = prompt(model, 34, seed=1)
    kv = model.kv()
    table = list(range(N_BLOCKS))
    seen = {}
    for p, t in enumerate(ids):
        seen[p + 1] = model.round(kv, [([t], p, table, True)])[0]
    for n in (1, 16, 17, 34):  # the first token, both sides of a block edge, the end
        assert_same(model, seen[n], model.prefill(ids[:n]))


def test_batched_rounds_equal_each_sequence_alone(model):
    lengths = (5, 18, 33)
    seqs = [prompt(model, n + 2, seed=10 + i) for i, n in enumerate(lengths)]
    tables = [[0], [1, 2], [3, 4, 5, 6]]  # one shared pool, disjoint blocks
    kv = model.kv()
    # round 1: three prefills of different lengths in one round
    out = model.round(kv, [(s[:n], 0, t, True) for s, n, t in zip(seqs, lengths, tables)])
    assert out.shape == (3, model.spec.vocab_size)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        assert_same(model, out[i], model.prefill(s[:n]))
    # round 2: one decode step for each of the three
    out = model.round(kv, [(s[n : n + 1], n, t, True) for s, n, t in zip(seqs, lengths, tables)])
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        assert_same(model, out[i], model.prefill(s[: n + 1]))
    # round 3: two decodes next to a sequence that wants no logits this round
    out = model.round(kv, [(seqs[0][6:7], 6, tables[0], True), (seqs[1][19:20], 19, tables[1], False),
                           (seqs[2][34:35], 34, tables[2], True)])
    assert out.shape == (2, model.spec.vocab_size)
    assert_same(model, out[0], model.prefill(seqs[0][:7]))
    assert_same(model, out[1], model.prefill(seqs[2][:35]))


def test_shuffled_block_table_equals_contiguous(model):
    ids = prompt(model, 41, seed=2)
    shuffled = [11, 3, 14]  # out of order, with gaps, over a pool of random garbage
    kv = model.kv(noise_seed=5)
    model.round(kv, [(ids[:20], 0, shuffled, False)])
    append = model.round(kv, [(ids[20:40], 20, shuffled, True)])[0]
    decode = model.round(kv, [(ids[40:], 40, shuffled, True)])[0]
    assert_same(model, append, model.prefill(ids[:40], table=[0, 1, 2]))
    assert_same(model, decode, model.prefill(ids, table=[0, 1, 2]))


class CountingDevice(CpuDevice):
    """The oracle, keeping every ctx begin_round builds and every ctx attention is given."""

    def __init__(self):
        self.built, self.seen = [], []

    def begin_round(self, batch):
        self.built.append(super().begin_round(batch))
        return self.built[-1]

    def attention(self, q, kv, layer, ctx, scale, window):
        self.seen.append(ctx)
        return super().attention(q, kv, layer, ctx, scale, window)


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
def test_an_executor_round_builds_one_ctx_that_every_layer_reads(tiny_paths, tmp_path, traced):
    """Through the executor's own round (plain, and with kernel tracing, whose wrapper
    must hand run_round to the real device): one begin_round per round, the same ctx in
    every layer's attention, and the logits the oracle gives."""
    src = open_model(tiny_paths["tiny-llama"])
    dev = CountingDevice()
    tracing = Tracing(TraceConfig(dir=str(tmp_path)), "engine") if traced else None
    ctx = zmq.Context()
    executor = ExecutorActor(ctx, Addresses.inproc(), src, dev, N_BLOCKS, BLOCK, tracing)
    try:
        ids = [5, 40, 77, 120, 9, 33, 250, 17]
        first = trio.run(executor.run_round, Round(1, [RoundSeq(7, ids, 0, 0, [3], True)]))
        second = trio.run(executor.run_round, Round(2, [RoundSeq(7, [11], len(ids), 1, [], True)]))
    finally:
        executor.close()
        if tracing is not None:
            tracing.close()
        ctx.term()
    n_layers = src.spec.n_layers
    assert len(dev.built) == 2 and len(dev.seen) == 2 * n_layers
    assert all(c is dev.built[0] for c in dev.seen[:n_layers]) and all(c is dev.built[1] for c in dev.seen[n_layers:])
    oracle = Model(tiny_paths["tiny-llama"])
    kv = oracle.kv()
    np.testing.assert_array_equal(first.logits, oracle.round(kv, [(ids, 0, [3], True)]))
    np.testing.assert_array_equal(second.logits, oracle.round(kv, [([11], len(ids), [3], True)]))


def test_devices_import_neither_models_nor_traces():
    """The dependency direction models -> devices: importing every devices module (cuda's
    too: cupy is imported only when a CudaDevice is made) loads no zinfer.models module,
    and no zinfer.traces one (the CUDA kernel clock is the device's own, devices/cuda_clock.py)."""
    import pkgutil
    import subprocess
    import sys

    import zinfer.devices

    names = [f"zinfer.devices.{m.name}" for m in pkgutil.iter_modules(zinfer.devices.__path__)]
    code = (f"import sys\nfor n in {names!r}: __import__(n)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('zinfer.models', 'zinfer.traces'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "zinfer.devices.round" in names and out.strip() == "[]"
