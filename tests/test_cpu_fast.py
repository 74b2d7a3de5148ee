"""The fast CPU device gives the numpy oracle's numbers.

Every numba kernel against kernels.reference / kernels.quants.dequantize on random
inputs (odd batch sizes, one row) and on real tensors; then whole forwards of SmolLM2
and Gemma 3 through FastCpuDevice against CpuDevice: close logits, the same greedy ids,
and a mixed round (prefill chunk + decodes) that matches.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from zinfer.devices import cpu_fast
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.kernels import cpu_ops as ops
from zinfer.kernels import cpu_quant as cq
from zinfer.kernels import reference as ref
from zinfer.kernels.quants import BLOCK_SHAPES, dequantize
from zinfer.models.batch import ForwardBatch
from zinfer.models.forward import forward
from zinfer.models.gguf_file import GGUFFile, TensorData
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

FAST_TYPES = cq.U4_TYPES + cq.I8_TYPES


def random_tensor(qt: QT, rows: int, cols: int, seed: int) -> TensorData:
    """Random blocks with sane fp16 scales (random bytes elsewhere)."""
    rng = np.random.default_rng(seed)
    epb, bpb = BLOCK_SHAPES[qt]
    b = rng.integers(0, 256, (rows * cols // epb, bpb), dtype=np.uint8)
    scale = (rng.random((b.shape[0], 1)) * 0.02).astype(np.float16).view(np.uint8)
    if qt == QT.Q6_K:
        b[:, 208:210] = scale
    else:
        b[:, 0:2] = scale
        if qt in (QT.Q4_1, QT.Q4_K):
            b[:, 2:4] = (rng.random((b.shape[0], 1)) * 0.02).astype(np.float16).view(np.uint8)
    return TensorData(qt, (rows, cols), b.reshape(rows, -1))


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> float:
    err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    assert err < tol, err
    return err


@pytest.mark.parametrize("qt", FAST_TYPES, ids=lambda q: q.name)
def test_packed_blocks_dequantize_bit_exact(qt):
    t = random_tensor(qt, 7, 512, seed=1)
    p = cq.repack(t.qtype, t.data, t.shape)
    out = np.empty(t.shape, np.float32)
    cq.dequantize_rows(p, np.arange(7, dtype=np.int64), out)
    np.testing.assert_array_equal(out, dequantize(t.data, qt, t.shape))


@pytest.mark.parametrize("qt", FAST_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3, 4, 5, 13, 33])
def test_linear_matches_reference(qt, T):
    rows = 37  # not a multiple of the rows per parallel task
    t = random_tensor(qt, rows, 512, seed=T)
    wf = dequantize(t.data, qt, t.shape)
    x = np.random.default_rng(T).standard_normal((T, 512), dtype=np.float32)
    bias = np.random.default_rng(2).standard_normal(rows, dtype=np.float32)
    want = ref.linear(x, wf, bias)
    for cache in (1 << 30, 0):  # with an f32 copy, and dequantizing tiles per call
        w = FastCpuDevice(f32_cache_bytes=cache).upload("w", t)
        close(FastCpuDevice().linear(x, w, bias), want)
    out = np.empty((T, rows), np.float32)
    cq.matmul(w.packed, x, out)  # the quantized kernel itself, at every T
    close(out, x @ wf.T)


def test_linear_on_real_tensors(smollm2_path, gemma3_path):
    dev = FastCpuDevice()
    seen = set()
    for path in (smollm2_path, gemma3_path):
        for name, t in GGUFFile(path).tensors.items():
            if len(t.shape) != 2 or t.qtype in seen or QT(t.qtype) not in FAST_TYPES:
                continue
            seen.add(t.qtype)
            w = dev.upload(name, t)
            wf = dequantize(t.data, t.qtype, t.shape)
            x = np.random.default_rng(0).standard_normal((3, t.shape[1]), dtype=np.float32)
            close(dev.linear(x, w), x @ wf.T)
            ids = np.array([0, 5, t.shape[0] - 1])
            np.testing.assert_array_equal(dev.embed(cq_only(w), ids), wf[ids])
    assert {QT(q) for q in seen} == {QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_0, QT.Q6_K}


def cq_only(w: cpu_fast.FastWeight) -> cpu_fast.FastWeight:
    return cpu_fast.FastWeight(w.shape, w.packed, None)


@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (3, 4, 64)])
def test_rms_norm_glu_rope(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal(shape[-1], dtype=np.float32)
    dev = FastCpuDevice()
    close(dev.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    g = rng.standard_normal(shape, dtype=np.float32).reshape(-1, shape[-1])
    u = x.reshape(-1, shape[-1])
    for act in ("silu", "gelu_tanh"):
        close(dev.glu(g, u, act), ref.glu(g, u, act))
    if len(shape) == 3:
        pos = np.array([0, 7, 1000])
        for inter in (True, False):
            for rope_dim in (64, 32):
                close(dev.rope(x, pos, 10000.0, rope_dim, inter), ref.rope(x, pos, 10000.0, rope_dim, inter), 1e-4)


@pytest.mark.parametrize("window", [0, 5])
def test_attention_mixed_round(window):
    """Long chunk (BLAS tiles), short appends and decodes (one numba kernel) in one round."""
    H, Hkv, hd, bs = 6, 2, 16, 4
    rng = np.random.default_rng(window)
    chunks = [(list(range(40)), 3, [9, 2, 7, 0, 5, 11, 1, 3, 4, 6, 8], False), ([1], 0, [10], True), ([1, 2, 3], 6, [12, 13, 14], True), ([1], 17, [15, 16, 17, 18, 19], True)]
    batch = ForwardBatch.build(chunks, bs)
    q = rng.standard_normal((batch.n_tokens, H, hd), dtype=np.float32)
    kv_ref, kv_fast = CpuDevice(llama_cpp_numerics=False).alloc_kv(1, Hkv, hd, 20, bs), FastCpuDevice().alloc_kv(1, Hkv, hd, 20, bs)
    for pool in ("k", "v"):
        data = rng.standard_normal(getattr(kv_ref, pool)[0].shape, dtype=np.float32)
        getattr(kv_ref, pool)[0][:] = data
        getattr(kv_fast, pool)[0][:] = data
    want = CpuDevice(llama_cpp_numerics=False).attention(q, kv_ref, 0, batch, 0.25, window)
    close(FastCpuDevice().attention(q, kv_fast, 0, batch, 0.25, window), want)


class Pair:
    """One model on both devices; `round` runs the same chunks through each."""

    def __init__(self, path):
        src = open_model(path)
        self.spec = src.spec
        # the plain f32 oracle: FastCpuDevice does not round activations to Q8 as
        # llama.cpp (and CpuDevice's default) do, so that would differ by ~2% of the logits
        self.devs = [CpuDevice(llama_cpp_numerics=False), FastCpuDevice()]
        self.ws = [build_weights(self.spec, src.tensors, d.upload) for d in self.devs]

    def kvs(self, n_blocks=32):
        return [d.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, n_blocks, 16) for d in self.devs]

    def round(self, kvs, chunks):
        b = ForwardBatch.build(chunks, 16)
        return [forward(self.spec, w, d, kv, b) for d, w, kv in zip(self.devs, self.ws, kvs)]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def pair(request):
    return Pair(request.getfixturevalue(f"{request.param}_path"))


def test_greedy_ids_and_logits_match_oracle(pair):
    """16 greedy tokens on two prompts (decoded together): same ids, logits close."""
    prompts = [[1, 504, 3458, 282, 4649, 314], [2, 17, 1000, 42, 7, 99, 3, 250, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    kvs = pair.kvs()
    tables = [list(range(0, 16)), list(range(16, 32))]
    ref_l, fast_l = pair.round(kvs, [(p, 0, t, True) for p, t in zip(prompts, tables)])
    ids = [[], []]
    worst = close(fast_l, ref_l, 1e-3)
    for step in range(16):
        nxt = ref_l.argmax(axis=1)
        assert (fast_l.argmax(axis=1) == nxt).all(), step
        for i in range(2):
            ids[i].append(int(nxt[i]))
        ref_l, fast_l = pair.round(kvs, [([int(n)], len(p) + step, t, True) for n, p, t in zip(nxt, prompts, tables)])
        worst = max(worst, close(fast_l, ref_l, 1e-3))
    print(f"max relative logit error {worst:.2e}; ids {ids}")


def test_mixed_round_matches_oracle(pair):
    """A prefill chunk of 40 tokens (long path) next to decodes and a short append."""
    kvs = pair.kvs()
    pair.round(kvs, [([5, 6, 7, 8], 0, [0], False), ([9] * 20, 0, [1, 2], False)])
    chunks = [(list(range(100, 140)), 0, [3, 4, 5], True), ([11], 4, [0], True), ([12, 13, 14], 20, [1, 2], True)]
    ref_l, fast_l = pair.round(kvs, chunks)
    close(fast_l, ref_l, 1e-3)
    assert (fast_l.argmax(axis=1) == ref_l.argmax(axis=1)).all()
