"""The outer-product prefill kernels (kernels/cpu_fast/int8/ir_outer.py, ir_convert.py) apply
the block scales in the one int8 float order (tests/int8_canonical.py): for Q5_0 (u5), Q4_K
(k4) and Q6_K (u6), at every width and activation row count, their product equals the numpy
reference bit for bit, so a prompt's rows do not change with the path their round takes.

The kernels run alone (convert every weight row, then every tile of 4 activation rows) and
inside products.matmul (its tasks of 32 activation rows or more take them; a task's rows past
its last full tile go to the row kernels, which this file does not check).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import int8_canonical
from test_cpu_fast import random_tensor
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir
from zinfer.kernels.cpu_fast.int8 import ir_outer
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast.int8.activations import QUANTIZERS

pytestmark = pytest.mark.skipif(not int8_ir.available(), reason="the int8 kernels need AVX512-VNNI or AVX2")

# type -> (its outer layout, the widths it has: cols % 128 for Q5_0's u5, % 256 for the K-quants)
CASES = {QT.Q5_0: ("u5", (256, 512, 768, 896)), QT.Q4_K: ("k4", (256, 512, 768)), QT.Q6_K: ("u6", (256, 512, 768))}


def _activations(T: int, cols: int, seed: int) -> np.ndarray:
    """x [T, cols] f32: normal values, an all-zero 32-block, and a 32-block 1e4 times the rest."""
    x = np.random.default_rng(seed).standard_normal((T, cols), dtype=np.float32)
    x[0, :32] = 0
    x[-1, 64:96] *= 1e4
    return x


def _outer(w: ci.Int8Weight, x: np.ndarray) -> np.ndarray:
    """x [T, cols] @ w.T by the two outer kernels alone (rows % 16 == 0, T % 4 == 0)."""
    rows, T = w.qs.shape[0], x.shape[0]
    A, S, N, C = QUANTIZERS[ci.activation_order(w)](x, ci.rounding_group(w), w.nsteps, w.nchunks, True)
    addresses = int8_ir.outer_addresses(w.kind)
    assert addresses is not None
    convert, product = (int8_ir.SIGNATURE.ctypes_function(a) for a in addresses)
    per_step = ir_outer.scratch_bytes_per_row_step(w.kind)
    scratch = np.empty(rows * w.nsteps * per_step, np.uint8)
    out = np.full((T, rows), np.nan, np.float32)
    common = dict(M=w.m.ctypes.data, A=A.ctypes.data, S=S.ctypes.data, N=N.ctypes.data, C=C.ctypes.data,
                  nsteps=w.nsteps, nchunks=w.nchunks, r0=0, r1=rows, t0=0,
                  astride=A.strides[0], sstride=S.strides[0], nstride=N.strides[0], cstride=C.strides[0])
    convert(W=w.qs.ctypes.data, D=w.d.ctypes.data, wstride=w.qs.strides[0], dstride=w.d.strides[0], t1=0,
            out=scratch.ctypes.data, ostride=0, **common)
    product(W=scratch.ctypes.data, D=scratch.ctypes.data, wstride=w.nsteps * per_step, dstride=0, t1=T,
            out=out.ctypes.data, ostride=rows, **common)
    return out


@pytest.mark.parametrize("qt", list(CASES), ids=lambda q: q.name)
def test_outer_kernels_equal_the_canonical_order_bit_for_bit(qt):
    """Every width of the type, weight rows 16 and 48, activation rows 4 to 36: equal to the
    reference exactly (np.testing.assert_array_equal: no tolerance)."""
    kind, widths = CASES[qt]
    for cols in widths:
        for rows, T in ((16, 4), (48, 36), (16, 12)):
            t = random_tensor(qt, rows, cols, seed=cols + rows + T)
            w = ci.from_gguf(qt, t.data, t.shape)
            assert w is not None and w.kind == kind
            x = _activations(T, cols, seed=cols * T)
            want = int8_canonical.product(qt, t.data, t.shape, x)
            np.testing.assert_array_equal(_outer(w, x), want, err_msg=f"{qt.name} [{rows}, {cols}] x {T} rows")


@pytest.mark.parametrize("qt", list(CASES), ids=lambda q: q.name)
def test_prefill_tasks_of_the_outer_products_equal_the_canonical_order(qt):
    """products.matmul (no AMX tiles: the weight carries none) at 32, 64 and 100 activation
    rows: all of them in the outer products' full tiles, equal to the reference bit for bit."""
    kind, widths = CASES[qt]
    cols = widths[-1]
    t = random_tensor(qt, 48, cols, seed=5)
    w = ci.from_gguf(qt, t.data, t.shape)
    assert w is not None and w.kind == kind and w.amx is None
    for T in (32, 64, 100):
        x = _activations(T, cols, seed=T)
        out = np.empty((T, 48), np.float32)
        ci.matmul(w, x, out)
        np.testing.assert_array_equal(out, int8_canonical.product(qt, t.data, t.shape, x), err_msg=f"{T} rows")
