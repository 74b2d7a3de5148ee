"""A NaN or an infinity inside the forward reaches the logits on every CPU device, so the
sampler's finite check fails the request instead of sampling plausible tokens from it.

cpu-fast's int8 kernels round activations to int8 codes: a NaN there used to become a
number (issue 32: a NaN output norm gave uniform logits, every token -ln(vocab)), and its
float kernels under fast-math could raise ZeroDivisionError on one. The files here are
corrupted past the loader's finite check on purpose (GGUFFile read directly): what the
kernels do with a non-finite value must not depend on that check.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gguf_corrupt import set_values
from tiny import write_tiny_gguf
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.devices.cpu_llama import LlamaCpuDevice
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_ops
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir
from zinfer.models.forward import round_logits
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.spec_readers import spec_from_gguf
from zinfer.models.weights import build_weights

from test_cpu_fast import random_tensor

SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
DEVICES = {
    "cpu": CpuDevice,
    "cpu-llama": LlamaCpuDevice,
    "cpu-fast": lambda: FastCpuDevice(int8=True),
    "cpu-fast-no-int8": lambda: FastCpuDevice(int8=False),
    "cpu-fast-graphs": lambda: FastCpuDevice(decode_graphs=True),
    "cpu-fast-kv-f32": lambda: FastCpuDevice(kv_f16=False),
}


def _rounds(path, dev) -> list[np.ndarray]:
    """Logits [2, vocab] of a prefill of two sequences, then of 3 decode steps, on dev
    (with decode graphs, the last steps replay the recorded tape)."""
    f = GGUFFile(path)
    spec = spec_from_gguf(f.metadata, tensors=f.tensors)
    w = build_weights(spec, f.tensors, dev.upload)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 8, 16)
    out = [round_logits(spec, w, dev, kv,
                        ForwardBatch.build([([1, 5, 9, 200, 7], 0, [0], True), ([3] * 20, 0, [1, 2], True)], 16))]
    for step in range(3):
        out.append(round_logits(spec, w, dev, kv, ForwardBatch.build(
            [([11 + step], 5 + step, [0], True), ([12], 20 + step, [1, 2], True)], 16)))
        assert dev.settle(120)
    if getattr(dev, "decode_graphs", False):
        assert dev.last_round_replayed, "the last decode step should have replayed its graph"
    return out


@pytest.fixture(scope="module", params=[QT.Q8_0, QT.Q5_0], ids=lambda q: q.name)
def tiny(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    return write_tiny_gguf(d / "good.gguf", "llama", qtype=request.param, **SHAPE)


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_a_non_finite_output_norm_gives_non_finite_logits(tiny, tmp_path, device, bad):
    """Every logits row of every round holds a NaN (the sampler fails it), never plausible
    tokens; the same device on the whole file gives finite logits (the control)."""
    broken = set_values(tiny, tmp_path / "broken.gguf", "output_norm.weight", bad)
    good = _rounds(tiny, DEVICES[device]())
    assert all(np.isfinite(r).all() for r in good)
    for i, r in enumerate(_rounds(broken, DEVICES[device]())):
        assert np.isnan(r.max(axis=1)).all(), f"round {i}: a NaN output norm gave finite logits on {device}"


@pytest.mark.parametrize("device", list(DEVICES))
def test_overflowing_weights_give_non_finite_logits(tiny, tmp_path, device):
    """Finite but huge norm weights (1e30) overflow the keys to inf: the attention softmax
    turns them into NaN (fast_exp's clamp would have made them finite weights)."""
    broken = set_values(tiny, tmp_path / "huge.gguf", "blk.0.attn_norm.weight", 1e30)
    for i, r in enumerate(_rounds(broken, DEVICES[device]())):
        assert np.isnan(r.max(axis=1)).all(), f"round {i}: overflowing activations gave finite logits on {device}"


@pytest.mark.skipif(not int8_ir.available(), reason="the int8 kernels need AVX512-VNNI or AVX2")
@pytest.mark.parametrize("qt", [QT.Q8_0, QT.Q4_1, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 5, 130])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_int8_product_of_a_non_finite_activation_row_is_nan(qt, T, bad):
    """x @ W.T through the int8 kernels: the row holding the value is NaN in every column,
    the other rows are the finite product (rounding a NaN to int8 codes made it a number)."""
    t = random_tensor(qt, 64, 512, seed=T)
    w = ci.from_gguf(qt, t.data, t.shape) or ci.prepare(cq.repack(qt, t.data, t.shape))
    x = np.random.default_rng(T).standard_normal((T, 512), dtype=np.float32)
    clean = np.empty((T, 64), np.float32)
    ci.matmul(w, x, clean)
    x[T - 1, 300] = bad
    out = np.empty((T, 64), np.float32)
    ci.matmul(w, x, out)
    assert np.isnan(out[T - 1]).all()
    np.testing.assert_array_equal(out[: T - 1], clean[: T - 1])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_float_kernels_pass_non_finite_values_on(bad):
    """glu and the attention softmax under fast-math: a NaN or inf in gives NaN out, no
    exception (a ZeroDivisionError in glu killed the round before)."""
    gate = np.full((9, 64), bad, np.float32)
    up = np.ones((9, 64), np.float32)
    for gelu in (False, True):
        for glu in (cpu_ops.glu, cpu_ops.glu_one):
            out = np.empty_like(gate)
            glu(gate, up, gelu, out)
            assert not np.isfinite(out).any()
    row = np.zeros(10, np.float32)
    row[3] = bad
    cpu_ops.softmax_(row, np.float32(1))
    assert np.isnan(row).all()
