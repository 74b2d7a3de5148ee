"""llama.cpp's arithmetic (kernels/llama_numerics.py, llama_ops.py) checked against the oracle.

Bit-equality with llama.cpp itself is what tests/test_greedy_goldens.py measures; here
each emulated kernel must stay within float rounding (or int8 rounding of activations)
of the plain float32 reference, on real quantized tensors of both models.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from zinfer.kernels import llama_numerics as ln
from zinfer.kernels import llama_ops as lo
from zinfer.kernels import reference as ref
from zinfer.kernels.quants import dequantize
from zinfer.models.loader import open_model

TENSORS = [  # (model fixture, tensor, its type)
    ("smollm2_path", "blk.0.attn_q.weight", "Q4_1"),
    ("smollm2_path", "blk.3.ffn_down.weight", "Q4_1"),
    ("gemma3_path", "blk.0.attn_q.weight", "Q5_0"),
    ("gemma3_path", "blk.1.attn_v.weight", "Q8_0"),
    ("gemma3_path", "blk.0.attn_output.weight", "Q4_K"),
    ("gemma3_path", "blk.0.ffn_down.weight", "Q6_K"),
]


@functools.cache
def _tensors(path):
    return open_model(path).tensors


@pytest.mark.slow
@pytest.mark.parametrize("fixture,name,qtype", TENSORS)
@pytest.mark.parametrize("rows", [1, 9])  # K-quants switch kernels from 8 rows
def test_quantized_products_stay_within_int8_rounding_of_the_oracle(fixture, name, qtype, rows, request):
    t = _tensors(request.getfixturevalue(fixture))[name]
    assert t.qtype.name == qtype
    w = dequantize(t.data, t.qtype, t.shape)  # [out, n]
    x = np.random.default_rng(0).standard_normal((rows, t.shape[1])).astype(np.float32)
    got = ln.matmul(x, ln.split_weight(t.data, t.qtype, t.shape))
    exact_rounded = ln.round_activations(x, ln.ACTIVATION_TYPE[qtype]).astype(np.float64) @ w.T.astype(np.float64)
    plain = x @ w.T
    scale = np.abs(plain).max()
    assert np.abs(got - exact_rounded).max() < 2e-3 * scale  # Q8_1's fp16 block sums are the loosest part
    assert np.abs(got - plain).max() < 3e-2 * scale  # int8 activations
    assert np.abs(ln.matmul_rounded(x, w, qtype) - got).max() < 2e-3 * scale


def test_float_ops_match_the_oracle_within_rounding():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4, 64)).astype(np.float32)
    pos = np.arange(5)
    np.testing.assert_allclose(lo.rope(x, pos, 10000.0, 64, True), ref.rope(x, pos, 10000.0, 64, True), atol=2e-6)
    np.testing.assert_allclose(lo.rope(x, pos, 1e6, 64, False), ref.rope(x, pos, 1e6, 64, False), atol=2e-6)
    h = rng.standard_normal((3, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    np.testing.assert_allclose(lo.rms_norm(h, w, 1e-5), ref.rms_norm(h, w, 1e-5), rtol=1e-6, atol=1e-6)
    g = (rng.standard_normal((2, 1536)) * 4).astype(np.float32)
    np.testing.assert_allclose(lo.silu(g), ref.silu(g), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lo.gelu_fp16(g), ref.gelu_tanh(g), rtol=2e-3, atol=1e-4)  # an fp16 table
    q = rng.standard_normal((7, 9, 64)).astype(np.float32)
    k = rng.standard_normal((70, 3, 64)).astype(np.float32)
    v = rng.standard_normal((70, 3, 64)).astype(np.float32)
    qpos = np.arange(63, 70)
    for window in (0, 16):
        np.testing.assert_allclose(lo.attention(q, k, v, qpos, 0.125, window), ref.attention(q, k, v, qpos, 0.125, window), atol=2e-6)
        one = slice(6, 7)  # a decode row sums p.v in another order
        np.testing.assert_allclose(lo.attention(q[one], k, v, qpos[one], 0.125, window), ref.attention(q[one], k, v, qpos[one], 0.125, window), atol=2e-6)


def test_v_expf_is_accurate_and_saturates():
    x = np.linspace(-87, 80, 20001, dtype=np.float32)  # below -87 results are subnormal
    got = lo.v_expf(x)
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=3e-7)
    assert lo.v_expf(np.float32([-np.inf, -200.0]))[0] == 0 and lo.v_expf(np.float32([-200.0]))[0] == 0
