"""The fast CPU device gives the numpy oracle's numbers.

Every numba kernel against kernels.reference / kernels.quants.dequantize on random
inputs (odd batch sizes, one row) and on real tensors. The int8 kernels (on VNNI or AVX2 CPUs)
round activations to int8 as llama.cpp does: their products equal the oracle's product
of the rounded activations, within float rounding. Then the kernel each weight gets at
upload. Whole forwards against the oracle: test_cpu_fast_forward.py.
"""

from __future__ import annotations


import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from zinfer.devices import cpu_fast_linears
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.quants import BLOCK_SHAPES, dequantize
from zinfer.devices.batch import ForwardBatch
from zinfer.kernels.tensor import TensorData
from zinfer.models.gguf_file import GGUFFile

FAST_TYPES = cq.U4_TYPES + cq.I8_TYPES
needs_vnni = pytest.mark.skipif(not int8_ir.available(), reason="the int8 kernels need AVX512-VNNI or AVX2")


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
        dev = FastCpuDevice(f32_cache_bytes=cache, int8=False)
        close(dev.linear(x, dev.upload("w", t), bias), want)
    out = np.empty((T, rows), np.float32)
    cq.matmul(dev.upload("w", t).packed, x, out)  # the float quantized kernel itself, at every T
    close(out, x @ wf.T)


@needs_vnni
@pytest.mark.parametrize("qt", FAST_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3, 4, 5, 13, 33, 130])
def test_int8_linear_is_the_product_of_rounded_activations(qt, T):
    rows, cols = 37, 512
    t = random_tensor(qt, rows, cols, seed=T)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    x = np.random.default_rng(T).standard_normal((T, cols), dtype=np.float32)
    x[0, :32] = 0  # an all-zero block
    dev = FastCpuDevice()
    w = dev.upload("w", t)
    assert w.int8 is not None
    out = np.empty((T, rows), np.float32)
    ci.matmul(w.int8, x, out)  # the kernel itself, at every T
    want = ci.rounded(x, ci.rounding_group(w.int8)) @ wf.T
    close(out, want)
    close(dev.linear(x, w), want)
    close(out, x @ wf.T, 2e-2)  # what int8 activations cost


@pytest.mark.slow
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
            close(dev.linear(x, w), (ci.rounded(x, ci.rounding_group(w.int8)) if w.int8 is not None else x) @ wf.T)
            ids = np.array([0, 5, t.shape[0] - 1])
            np.testing.assert_array_equal(dev.embed(cq_only(w), ids), wf[ids])
    assert {QT(q) for q in seen} == {QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_0, QT.Q6_K}


def cq_only(w: cpu_fast_linears.FastWeight) -> cpu_fast_linears.FastWeight:
    """w's quantized forms only (no f32 copy): embed reads the packed blocks, or the int8 view where it is all
    (Q5_0, Q6_K)."""
    return cpu_fast_linears.FastWeight(w.shape, w.packed, None, w.int8)


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
        # a round at these positions
        ctx = dev.begin_round(ForwardBatch.build([([0], int(p), [0], False) for p in pos], 1024))
        for inter in (True, False):
            for rope_dim in (64, 32):
                close(dev.rope(x, ctx, 10000.0, rope_dim, inter), ref.rope(x, pos, 10000.0, rope_dim, inter), 1e-4)


@pytest.mark.parametrize("kv_f16", [True, False])
@pytest.mark.parametrize("window, hd", [(0, 16), (5, 16), (19, 64)])
def test_attention_mixed_round(window, hd, kv_f16):
    """A long chunk appended after 3 cached tokens (the blockwise kernel), short appends
    and decodes (the paged kernel) in one round, over f16 or f32 K/V pools."""
    H, Hkv, bs = 6, 2, 4
    rng = np.random.default_rng(window)
    chunks = [(list(range(40)), 3, [9, 2, 7, 0, 5, 11, 1, 3, 4, 6, 8], False), ([1], 0, [10], True),
              ([1, 2, 3], 6, [12, 13, 14], True), ([1], 17, [15, 16, 17, 18, 19], True)]
    batch = ForwardBatch.build(chunks, bs)
    q = rng.standard_normal((batch.n_tokens, H, hd), dtype=np.float32)
    fast = FastCpuDevice(kv_f16=kv_f16)
    kv_ref, kv_fast = CpuDevice().alloc_kv(1, Hkv, hd, 20, bs), fast.alloc_kv(1, Hkv, hd, 20, bs)
    assert kv_fast.k[0].dtype == (np.float16 if kv_f16 else np.float32)
    for pool in ("k", "v"):
        data = rng.standard_normal(getattr(kv_ref, pool)[0].shape, dtype=np.float32)
        getattr(kv_fast, pool)[0][:] = data
        getattr(kv_ref, pool)[0][:] = getattr(kv_fast, pool)[0]  # what the pool kept
    oracle = CpuDevice()
    want = oracle.attention(q, kv_ref, 0, oracle.begin_round(batch), 0.25, window)
    close(fast.attention(q, kv_fast, 0, fast.begin_round(batch), 0.25, window), want)


@pytest.mark.parametrize("window", [0, 64])
def test_long_chunk_attention_gemma_heads(window):
    """The blockwise kernel at Gemma 3's head shape (4 query heads on 1 KV head of 256):
    100 rows appended after 37 cached tokens, causal, with and without a sliding window."""
    H, Hkv, hd, bs, past, n = 4, 1, 256, 16, 37, 100
    blocks = -(-(past + n) // bs)
    rng = np.random.default_rng(window)
    table = [int(b) for b in rng.permutation(blocks + 2)[:blocks]]
    batch = ForwardBatch.build([(list(range(n)), past, table, True)], bs)
    q = rng.standard_normal((n, H, hd), dtype=np.float32)
    fast = FastCpuDevice()
    kv_ref, kv_fast = CpuDevice().alloc_kv(1, Hkv, hd, blocks + 2, bs), fast.alloc_kv(1, Hkv, hd, blocks + 2, bs)
    for pool in ("k", "v"):
        getattr(kv_fast, pool)[0][:] = rng.standard_normal(getattr(kv_ref, pool)[0].shape, dtype=np.float32)
        getattr(kv_ref, pool)[0][:] = getattr(kv_fast, pool)[0]
    oracle = CpuDevice()
    want = oracle.attention(q, kv_ref, 0, oracle.begin_round(batch), 0.0625, window)
    close(fast.attention(q, kv_fast, 0, fast.begin_round(batch), 0.0625, window), want)


@pytest.mark.parametrize("H, Hkv, hd, window", [(4, 1, 256, 0), (9, 3, 64, 0), (6, 2, 64, 21)])
def test_prefilled_rows_equal_the_same_rows_decoded_bit_for_bit(H, Hkv, hd, window):
    """A long chunk's rows (the blockwise kernel, its wide GEMM and row blocks) equal each row
    attended alone as a decode over the same keys (the paged kernel): what lets a token
    decoded and the same token prefilled give the same logits."""
    bs, past, n = 16, 5, 70
    blocks = -(-(past + n) // bs)
    table = list(range(blocks))
    rng = np.random.default_rng(hd + window)
    q = rng.standard_normal((n, H, hd), dtype=np.float32)
    fast = FastCpuDevice()
    kv = fast.alloc_kv(1, Hkv, hd, blocks, bs)
    for pool in ("k", "v"):
        getattr(kv, pool)[0][:] = rng.standard_normal(getattr(kv, pool)[0].shape, dtype=np.float32)
    prefill = ForwardBatch.build([(list(range(n)), past, table, True)], bs)
    assert fast.begin_round(prefill).attention_split(True).long  # the blockwise kernel
    got = fast.attention(q, kv, 0, fast.begin_round(prefill), 0.125, window)
    decodes = ForwardBatch.build([([1], past + t, table, True) for t in range(n)], bs)  # n one-row sequences
    want = fast.attention(q, kv, 0, fast.begin_round(decodes), 0.125, window)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("T", [1, 9])
def test_write_kv_rounds_to_f16_as_numpy(T):
    """f16 pools hold exactly numpy's rounding of K and V (nearest even, overflow to inf,
    subnormals kept), in the given slots only."""
    dev = FastCpuDevice()
    kv = dev.alloc_kv(1, 3, 64, 4, 16)
    rng = np.random.default_rng(T)
    k = (rng.standard_normal((T, 3, 64)) * 100).astype(np.float32)
    k[0, 0, :4] = [1e-6, 7e4, -1e-8, 0.1]
    v = rng.standard_normal((T, 3, 64)).astype(np.float32)
    slots = rng.permutation(64)[:T]
    # one-slot blocks: ctx.slots == slots
    ctx = dev.begin_round(ForwardBatch.build([(list(range(T)), 0, slots, False)], 1))
    with np.errstate(over="ignore"):
        dev.write_kv(kv, 0, k, v, ctx)
        assert (np.array_equal(kv.k[0][slots], k.astype(np.float16))
                and np.array_equal(kv.v[0][slots], v.astype(np.float16)))
    untouched = np.setdiff1d(np.arange(64), slots)
    assert not kv.k[0][untouched].any() and not kv.v[0][untouched].any()


# ---- the kernel each weight gets at upload (devices/cpu_fast_linears.py) ----

FALLBACK_TYPES = (QT.Q5_1, QT.F16, QT.BF16, QT.F32)  # no packed kernel: f32 through BLAS


def written_tensor(qt: QT, rows: int, cols: int, seed: int) -> TensorData:
    """A tensor of a type random_tensor does not cover, written by gguf.quants from random values."""
    import gguf

    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(np.float32)
    q = gguf.quants.quantize(w, qt)
    return TensorData(qt, (rows, cols), q if q.dtype != np.uint8 else q.reshape(rows, -1))


def expected_kernel(qt: QT, int8: bool):
    from zinfer.devices import cpu_fast_linears as fl

    if qt not in FAST_TYPES:
        return fl.F32Linear
    return fl.Int8Linear if int8 else fl.QuantLinear


@pytest.mark.parametrize("qt", FAST_TYPES + FALLBACK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("int8", [True, False], ids=["int8", "float"])
@pytest.mark.parametrize("cache", [1 << 30, 0], ids=["f32-copy", "no-copy"])
def test_each_weight_gets_its_kernel_at_upload_and_the_oracles_product(qt, int8, cache):
    """Int8Linear (VNNI or AVX2) or QuantLinear for packed types, F32Linear for the rest; every
    product equals the oracle's (f64 product of the dequantized matrix; int8: of the
    rounded activations) within 1e-5 of its largest value, at T on both sides of
    QuantLinear's switch from the quantized kernel to BLAS."""
    if int8 and not int8_ir.available():
        pytest.skip("the int8 kernels need AVX512-VNNI or AVX2")
    rows, cols = 37, 512
    t = random_tensor(qt, rows, cols, seed=4) if qt in FAST_TYPES else written_tensor(qt, rows, cols, seed=4)
    dev = FastCpuDevice(f32_cache_bytes=cache, int8=int8)
    w = dev.upload("w", t)
    assert type(w) is expected_kernel(qt, int8)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    switch = getattr(w, "small_rows", 4)
    if type(w).__name__ == "QuantLinear":
        assert (w.f32 is not None, switch) == ((True, cpu_fast_linears.SMALL_BATCH) if cache
                                               else (False, cpu_fast_linears.SMALL_BATCH_NO_COPY))
    if type(w).__name__ == "Int8Linear":
        assert w.f32 is None and w.int8 is not None  # no f32 copy: the int8 kernels serve every T
    for T in (1, switch, switch + 1, 33):
        x = np.random.default_rng(T).standard_normal((T, cols), dtype=np.float32)
        want = (ci.rounded(x, ci.rounding_group(w.int8)) if w.int8 is not None else x) @ wf.T
        close(dev.linear(x, w), want)
        close(w.compute(x), want)


@needs_vnni
def test_int8_weights_of_one_layout_share_a_launch_and_give_their_own_products():
    rows, cols = 40, 256
    ws = tuple(FastCpuDevice().upload(n, random_tensor(QT.Q8_0, rows, cols, seed=i)) for i, n in enumerate("qkv"))
    dev = FastCpuDevice()
    bias = np.arange(rows, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((5, cols), dtype=np.float32)
    outs = dev.linears(x, ws, (None, bias, None))
    assert [len(m) for _, m in dev.int8_jobs(ws)] == [3]  # one group: one rounding of x, one launch
    for out, w, b in zip(outs, ws, (0, bias, 0)):
        np.testing.assert_allclose(out, w.compute(x) + b, rtol=0, atol=1e-5)


def test_a_type_without_packed_kernel_is_warned_once_naming_type_and_bytes():
    from structlog.testing import capture_logs

    dev = FastCpuDevice()
    with capture_logs() as logs:
        dev.upload("a", written_tensor(QT.Q5_1, 8, 64, 0))
        dev.upload("b", written_tensor(QT.Q5_1, 8, 64, 1))
        dev.upload("c", written_tensor(QT.F32, 8, 64, 0))  # already f32: nothing to say
        dev.upload("d", random_tensor(QT.Q8_0, 8, 64, 0))  # packed
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    w = warnings[0]
    assert (w["type"], w["becomes"], w["first_tensor"]) == ("Q5_1", "F32", "a")
    assert w["first_tensor_bytes"] == f"{8 * 64 // 32 * 24} -> {8 * 64 * 4}"  # Q5_1: 24 bytes per 32 values
