"""The int8 products on AMX tiles (kernels/cpu_fast/int8/amx_*.py).

On any host: the kernels' IR parses, verifies and compiles for sapphirerapids to tile
instructions, and the tile layout holds the file's values at the places tdpbssd reads.
On a host whose CPU has AMX-INT8 (and Linux grants the tiles): the tiles' integer sums are
exact and equal the VNNI kernels' on the same codes, every covered type's product is the
oracle's to f32 accuracy at any row count (tails of a tile included), and a row's result
does not depend on the rows beside it (batched = alone) nor on the path (a decode row on the
VNNI kernels = the same row in a prefill on the tiles, bit for bit: one float order,
tests/int8_canonical.py; test_int8_order_amx.py checks the tiles against it).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from test_cpu_fast import close, random_tensor
from zinfer.kernels.cpu_fast import llvm_host
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_ir, amx_layout
from zinfer.kernels.oracle.quants import dequantize

SPR = ("sapphirerapids", "+amx-tile,+amx-int8,+avx512f,+avx512bw,+avx512vl,+avx512dq")
on_amx = pytest.mark.skipif(not amx_host.tiles_permitted(), reason="needs a CPU with AMX-INT8 and the OS's permission")


def test_amx_ir_compiles_for_sapphirerapids_to_tile_instructions():
    from zinfer.kernels.cpu_fast.int8 import amx_products

    asm = llvm_host.compile_for_target(amx_products.module_ir(), *SPR)
    for kind in amx_products.KINDS:
        assert f"{amx_ir.kernel_name(kind)}:" in asm
    for op in ("ldtilecfg", "tileloadd", "tdpbssd", "tilestored", "vcvtdq2ps", "vfmadd", "vpslld"):
        assert op in asm, op
    peak = llvm_host.compile_for_target(amx_ir.peak_ir(), *SPR)
    assert peak.count("tdpbssd") >= amx_ir.PEAK_TILES


def test_amx_needs_both_tile_features():
    assert amx_host.cpu_has_amx("+avx512f,+amx-tile,+amx-int8,+avx512vnni")
    assert not amx_host.cpu_has_amx("+avx512f,+amx-tile,-amx-int8,+avx512vnni")
    assert not amx_host.cpu_has_amx("+avx2,+fma")


def test_a_bad_kernels_choice_is_refused_and_vnni_is_honoured(monkeypatch):
    monkeypatch.setenv(amx_host.KERNELS_ENV, "tiles")
    with pytest.raises(ValueError, match="ZINFER_INT8_KERNELS"):
        amx_host.kernels_choice()
    monkeypatch.setenv(amx_host.KERNELS_ENV, "vnni")
    assert amx_host.kernels_choice() == "vnni"
    monkeypatch.delenv(amx_host.KERNELS_ENV)
    monkeypatch.setenv(amx_host.ISA_ENV, "avx2")  # the AVX2 kernels asked for: no tiles
    assert amx_host.kernels_choice() == "avx2"


@pytest.mark.parametrize("qt", amx_layout.TYPES, ids=lambda q: q.name)
def test_tile_layout_holds_the_files_values_where_tdpbssd_reads_them(qt):
    rows, cols = 64, 512
    t = random_tensor(qt, rows, cols, seed=5)
    w = amx_layout.from_gguf(qt, t.data, t.shape)
    assert w is not None and w.block == (64 if qt in (QT.Q4_K, QT.Q6_K) else 32)
    np.testing.assert_array_equal(amx_layout.dequantized(w), dequantize(t.data, qt, t.shape))
    # B tile (16 rows, block b): byte 4n + c of tile row k is column 4k + c of the block of row n
    codes = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    tiled = amx_layout.tiles((codes % 251 - 125).astype(np.int8), w.block)
    r, b, k, n, c = 1, 3, 2, 5, 1
    assert tiled[r, b, k, n, c] == np.int8(codes[16 * r + n, w.block * b + 4 * k + c] % 251 - 125)
    assert amx_layout.from_gguf(qt, t.data[:48], (48, cols)) is None  # not a multiple of the kernels' 32 rows


# ---- on an AMX host ----


def _products():
    from zinfer.devices import cpu_fast_linears as fl
    from zinfer.kernels.cpu_fast.int8 import products as ci

    return fl, ci


@on_amx
@pytest.mark.slow  # compiles amx_products' numba driver and quantizer on a first run
def test_tile_sums_are_exact_and_the_vnni_kernels():
    """Q8_0 weights with d = 1 and activations whose every block holds +-127 (d_a = 1): both
    paths' outputs are the integer sums themselves, exactly."""
    fl, ci = _products()
    rows, cols, T = 64, 512, 48
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (rows * cols // 32, 32)).astype(np.int8)
    blocks = np.zeros((q.shape[0], 34), np.uint8)
    blocks[:, 0:2] = np.ones(1, np.float16).view(np.uint8)
    blocks[:, 2:] = q.view(np.uint8)
    x = rng.integers(-127, 128, (T, cols)).astype(np.float32)
    x[:, ::32] = 127
    w = fl.linear_for(QT.Q8_0, blocks.reshape(rows, -1), (rows, cols), True, fl.F32Budget(0)).int8
    assert w.amx is not None
    tiles, vnni = np.empty((T, rows), np.float32), np.empty((T, rows), np.float32)
    ci.matmul(w, x, tiles)
    ci.matmul(w._replace(amx=None), x, vnni)
    exact = x.astype(np.int64) @ q.reshape(rows, cols).astype(np.int64).T
    np.testing.assert_array_equal(tiles, exact)
    np.testing.assert_array_equal(tiles, vnni)


@on_amx
@pytest.mark.slow  # compiles amx_products' numba driver and quantizer on a first run
@pytest.mark.parametrize("qt", amx_layout.TYPES, ids=lambda q: q.name)
def test_every_type_on_tiles_is_the_oracles_and_rows_are_independent(qt):
    fl, ci = _products()
    rows, cols = 96, 512
    t = random_tensor(qt, rows, cols, seed=7)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    w = fl.linear_for(qt, t.data, t.shape, True, fl.F32Budget(0)).int8
    assert w.amx is not None
    x = np.random.default_rng(1).standard_normal((150, cols), dtype=np.float32)
    x[0, :32] = 0
    x[-1, 64:96] *= 1e4
    group = ci.rounding_group(w)
    outs = {}
    for T in (32, 45, 150):  # a whole tile step, a tail, several tasks and a tail
        out = np.full((T, rows), np.nan, np.float32)
        ci.matmul(w, x[:T], out)
        assert close(out, ci.rounded(x[:T], group) @ wf.T, tol=1e-6) < 1e-6
        outs[T] = out
    np.testing.assert_array_equal(outs[150][:45], outs[45])  # batched = alone: a row sees no other row
    np.testing.assert_array_equal(outs[45][:32], outs[32])
    decode = np.empty((1, rows), np.float32)
    ci.matmul(w, x[44:45], decode)  # one row: the VNNI kernels
    np.testing.assert_array_equal(decode, outs[45][44:45])
