"""The int8 row kernels follow the one float order of every int8 path (tests/int8_canonical.py)
bit for bit, so a row's result is the same whatever shares its round: decode alone, a few
sequences batched, a tile of 4 activation rows or its tail, an odd weight row."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import int8_canonical as canonical
from test_cpu_fast import random_tensor
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.cpu_fast.int8 import products as ci

pytestmark = pytest.mark.skipif(not ci.available(), reason="needs the int8 kernels (AVX2 or AVX512-VNNI)")

# (type, columns) -> the layout it takes: u4, p8 (Q8_0; Q5_0 off 128 columns), u5, k4, u6
CASES = [(QT.Q4_1, 512), (QT.Q4_0, 256), (QT.Q8_0, 576), (QT.Q5_0, 576), (QT.Q5_0, 896), (QT.Q4_K, 768),
         (QT.Q6_K, 512)]


def _int8_view(qt: QT, t) -> ci.Int8Weight:
    w = ci.from_gguf(qt, t.data, t.shape) or ci.prepare(cq.repack(qt, t.data, t.shape))
    assert w is not None
    return w


@pytest.mark.parametrize("qt, cols", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_row_kernels_are_the_shared_order_bit_for_bit(qt, cols):
    rows = 37  # odd: the one-row kernels take the last
    t = random_tensor(qt, rows, cols, seed=cols)
    w = _int8_view(qt, t)
    assert w.kind == canonical.kind_of(qt, cols)
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((31, cols), dtype=np.float32)  # under the outer products' 32 rows
    x[3] *= 1e-3  # rows of very different sizes: their scales must not mix
    x[7, : cols // 2] = 0
    want = canonical.product(qt, t.data, t.shape, x)
    for T in (1, 2, 3, 5, 31):  # 3 (and 31's last 3): the 4-row tile over 3 rows (ir_frame.entry)
        out = np.empty((T, rows), np.float32)
        ci.matmul(w, x[:T], out)
        np.testing.assert_array_equal(out, want[:T], err_msg=f"{T} rows")
    alone = np.empty((1, rows), np.float32)
    ci.matmul(w, x[7:8], alone)  # a row alone = the same row in a round of 31
    np.testing.assert_array_equal(alone[0], want[7])
