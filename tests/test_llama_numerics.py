"""llama.cpp's arithmetic (kernels/llama_cpp/: llama_numerics.py, llama_repack.py, llama_ops.py)
checked against llama.cpp and the oracle.

On a tiny all-Q4_K model (tests/goldens/tiny_q4k.py) cpu-llama's final hidden states
must equal llama.cpp's bit for bit, with its weight repacking and without. Greedy parity
on the real models is what tests/test_greedy_goldens.py measures; here each emulated
kernel must also stay within float rounding (or int8 rounding of activations) of the
plain float32 reference, on real quantized tensors of both models.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu_llama import LlamaCpuDevice
from zinfer.kernels.llama_cpp import llama_numerics as ln
from zinfer.kernels.llama_cpp import llama_ops as lo
from zinfer.kernels.llama_cpp import llama_repack as lr
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.quants import dequantize
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

GOLDENS = Path(__file__).parent / "goldens"
sys.path.insert(0, str(GOLDENS))
from tiny_q4k import NEXT, PROMPT, write_tiny_q4k  # noqa: E402


class HeadInputs(LlamaCpuDevice):
    """cpu-llama that keeps what enters the output projection: the final hidden states."""

    head = None

    def linear(self, x, w, b=None):
        if w is self.head:
            self.hidden.append(np.array(x))
        return super().linear(x, w, b)


@pytest.fixture(scope="module")
def tiny_q4k(tmp_path_factory):
    return open_model(write_tiny_q4k(tmp_path_factory.mktemp("tiny") / "tiny_q4k.gguf"))


@pytest.mark.parametrize("repack", [True, False])
def test_tiny_q4k_hidden_states_equal_llama_cpps(tiny_q4k, repack):
    """A 6-token prefill (one 4-row gemm group, two gemv rows when repacked) and one
    decode step: every value as llama.cpp computes it, repacked or not."""
    golden = json.loads((GOLDENS / "tiny_q4k.json").read_text())
    spec = tiny_q4k.spec
    dev = HeadInputs(repack=repack)
    dev.hidden = []
    weights = build_weights(spec, tiny_q4k.tensors, dev.upload)
    dev.head = weights.output
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 1, 16)
    prefill = replace(ForwardBatch.build([(PROMPT, 0, [0], True)], 16), logits_rows=np.arange(len(PROMPT)))
    round_logits(spec, weights, dev, kv, prefill)
    round_logits(spec, weights, dev, kv, ForwardBatch.build([([NEXT], len(PROMPT), [0], True)], 16))
    ours = np.concatenate(dev.hidden)  # [7, 256]
    want = np.array(golden["repack" if repack else "norepack"], np.float32)
    other = np.array(golden["norepack" if repack else "repack"], np.float32)
    assert not np.array_equal(want, other)  # the two kernels round differently here
    np.testing.assert_array_equal(ours, want)


def test_repacking_follows_llama_cpps_rule():
    """Q4_0, Q4_K, IQ4_NL, MXFP4 and Q2_K weights of a multiple of 8 rows (x86 AVX-512)."""
    assert lr.repacks("Q4_K", (896, 4864)) and lr.repacks("Q4_0", (8, 32)) and lr.repacks("Q2_K", (16, 256))
    assert (not lr.repacks("Q4_K", (20, 256)) and not lr.repacks("Q6_K", (896, 4864))
            and not lr.repacks("Q8_0", (896, 896)))
    assert not lr.repacks("Q4_K", (256,))


def test_gemm_rows_round_ties_of_the_largest_magnitude_as_ggml():
    """The 4-row quantizer takes the scale's sign from any value equal to +max|x|; the
    row quantizer from the first value of largest magnitude."""
    x = np.zeros((1, 256), np.float32)
    x[0, 3], x[0, 7], x[0, 9] = -2.0, 2.0, 0.5
    row = ln.quantize_activations(x, "Q8_K")
    four = ln.quantize_activations(x, "Q8_K", interleaved=True)
    assert row.d[0, 0] > 0 > four.d[0, 0]
    np.testing.assert_array_equal(row.codes * row.d[0, 0], four.codes * four.d[0, 0])

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
        np.testing.assert_allclose(lo.attention(q, k, v, qpos, 0.125, window),
                                   ref.attention(q, k, v, qpos, 0.125, window), atol=2e-6)
        one = slice(6, 7)  # a decode row sums p.v in another order
        np.testing.assert_allclose(lo.attention(q[one], k, v, qpos[one], 0.125, window),
                                   ref.attention(q[one], k, v, qpos[one], 0.125, window), atol=2e-6)


def test_v_expf_is_accurate_and_saturates():
    x = np.linspace(-87, 80, 20001, dtype=np.float32)  # below -87 results are subnormal
    got = lo.v_expf(x)
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=3e-7)
    assert lo.v_expf(np.float32([-np.inf, -200.0]))[0] == 0 and lo.v_expf(np.float32([-200.0]))[0] == 0


def test_no_repack_flag_reaches_the_llama_device():
    from zinfer.devices.config import CpuLlamaConfig
    from zinfer.devices.registry import make_device
    from zinfer.gateway.cli import parser
    from zinfer.gateway.cli_config import engine_config

    config = engine_config(parser().parse_args(["run", "--device", "cpu-llama", "--no-repack", "hi"]))
    assert config.device_options == CpuLlamaConfig(repack=False)
    assert make_device(config.device, config.device_options).repack is False
    assert make_device("cpu-llama").repack is True  # llama.cpp's default
