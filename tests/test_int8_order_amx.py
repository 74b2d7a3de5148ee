"""The AMX tile products (kernels/cpu_fast/int8/amx_*.py) follow the one int8 float order
(tests/int8_canonical.py) bit for bit: for every type with tiles, widths whose int8 view is
each kind, any count of activation rows (tails of a tile step and of a task included), a
zero block and a block of huge values, alone or sharing a launch with matrices of other kinds
of the same activation rounding. A matrix whose int8 view is "i8" gets no tiles."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import int8_canonical
from test_cpu_fast import random_tensor
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_layout

on_amx = pytest.mark.skipif(not amx_host.tiles_permitted(), reason="needs a CPU with AMX-INT8 and the OS's permission")
ROWS = 64
CASES = [  # (type, cols): each kind at several widths
    *[(qt, cols) for qt in (QT.Q4_0, QT.Q4_1) for cols in (256, 576, 896)],  # u4
    (QT.Q8_0, 512), (QT.Q8_0, 896), (QT.Q5_0, 320), (QT.Q5_0, 576),  # p8
    (QT.Q5_0, 256), (QT.Q5_0, 768), (QT.Q5_0, 896),  # u5
    *[(qt, cols) for qt in (QT.Q4_K, QT.Q6_K) for cols in (256, 512, 768)],  # k4, u6
]


def test_the_tiles_kind_is_the_int8_views():
    for qt, cols in CASES:
        t = random_tensor(qt, ROWS, cols, seed=3)
        w = amx_layout.from_gguf(qt, t.data, t.shape)
        assert w is not None and w.kind == int8_canonical.kind_of(qt, cols), (qt.name, cols)
    for qt in (QT.Q8_0, QT.Q5_0):  # cols % 64 != 0: the "i8" view, no tiles
        t = random_tensor(qt, ROWS, 96, seed=3)
        assert amx_layout.from_gguf(qt, t.data, t.shape) is None


@on_amx
@pytest.mark.parametrize(("qt", "cols"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_tiles_equal_the_canonical_order_bit_for_bit(qt, cols):
    from zinfer.kernels.cpu_fast.int8 import amx_products

    t = random_tensor(qt, ROWS, cols, seed=cols)
    w = amx_layout.from_gguf(qt, t.data, t.shape)
    assert w is not None
    jobs = amx_products.job_table([w], [0])
    assert jobs is not None
    x = np.random.default_rng(cols).standard_normal((150, cols), dtype=np.float32)
    x[0, :32] = 0  # a zero block
    x[-1, 64:96] *= 1e4  # a block of huge values beside ordinary ones in its super-block
    for T in (16, 45, 150):  # a step's tail, a step and a tail, two tasks
        out = np.full(T * ROWS, np.nan, np.float32)
        amx_products.product(jobs, x[-T:], w.group, out)
        want = int8_canonical.product(qt, t.data, t.shape, x[-T:])
        np.testing.assert_array_equal(out.reshape(T, ROWS), want, err_msg=f"{T} rows")


@on_amx
@pytest.mark.parametrize("types", [(QT.Q4_K, QT.Q6_K), (QT.Q4_1, QT.Q8_0, QT.Q5_0)], ids=["k4+u6", "u4+p8+u5"])
def test_matrices_of_one_rounding_share_a_launch_each_in_its_own_order(types):
    from zinfer.kernels.cpu_fast.int8 import amx_products

    cols, T = 512, 40
    ts = [random_tensor(qt, ROWS * (i + 1), cols, seed=i) for i, qt in enumerate(types)]
    ws = [amx_layout.from_gguf(t.qtype, t.data, t.shape) for t in ts]
    firsts = np.cumsum([0] + [t.shape[0] for t in ts])
    jobs = amx_products.job_table(ws, [int(f) for f in firsts[:-1]])
    assert jobs is not None
    other = QT.Q8_0 if ws[0].group == 256 else QT.Q4_K  # activations rounded per 32 vs per 256: no shared launch
    t = random_tensor(other, ROWS, cols, seed=5)
    assert amx_products.job_table([ws[0], amx_layout.from_gguf(other, t.data, t.shape)], [0, ROWS]) is None
    x = np.random.default_rng(9).standard_normal((T, cols), dtype=np.float32)
    out = np.full(T * int(firsts[-1]), np.nan, np.float32)
    amx_products.product(jobs, x, ws[0].group, out)
    for t, a, b in zip(ts, firsts[:-1], firsts[1:]):
        want = int8_canonical.product(QT(t.qtype), t.data, t.shape, x)
        np.testing.assert_array_equal(out[T * a : T * b].reshape(T, b - a), want)
