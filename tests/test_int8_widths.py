"""cpu-fast reads Q5_0, Q6_K and Q4_K at (about) the file's width (kernels/cpu_fast/int8/: the layout table of
products.py, u5, u6, k4).

Each product equals the oracle's (the dequantized matrix times the activations rounded
as the int8 kernels round them: per 32 columns, per 256 for the K-quants) and, for Q5_0,
the widened int8 path it replaces (p8) up to f32 rounding: the same rounded activations
and exact integers, summed in float in another order. The resident bytes are the file's: 5.5 bits per weight for
Q5_0, 6.5625 for Q6_K, 4.625 for Q4_K (and every other int8 matrix keeps only its kernels' layout, no
packed blocks next to it). A whole tiny Q5_0 model gives the same logits either way.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from test_cpu_fast import close, random_tensor
from tiny import write_tiny_gguf
from zinfer.devices import cpu_fast_linears as fl
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.cpu_fast.int8 import layouts as bp
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir
from zinfer.kernels.cpu_fast.int8 import row_driver
from zinfer.kernels.oracle.quants import dequantize
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

pytestmark = pytest.mark.skipif(not int8_ir.available(), reason="the int8 kernels need AVX512-VNNI or AVX2")

OWN_WIDTH = {QT.Q5_0: ("u5", "p8"), QT.Q6_K: ("u6", "i8"), QT.Q4_K: ("k4", "u4")}  # kind, the widened kind
# kind, bits per weight held (the file's: 5.5, 6.5625, 8.5, 5.0; Q4_0 4.5: its m = -8 d is kept; Q4_K 4.5: its 6-bit
# scales as bytes)
RESIDENT = {QT.Q5_0: ("u5", 5.5), QT.Q6_K: ("u6", 6.5625), QT.Q8_0: ("p8", 8.5), QT.Q4_1: ("u4", 5.0),
            QT.Q4_0: ("u4", 5.0), QT.Q4_K: ("k4", 4.625)}


def _product_case(qt, T):
    """A [37, 512] matrix of type qt (37 rows: not a multiple of the kernels' rows or of a
    parallel task's), its f64 values, and activations x [T, 512] with an all-zero block and
    one block far larger than the rest."""
    rows, cols = 37, 512
    t = random_tensor(qt, rows, cols, seed=T)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    x = np.random.default_rng(T).standard_normal((T, cols), dtype=np.float32)
    x[0, :32] = 0
    x[-1, 64:96] *= 1e4
    return t, wf, x


@pytest.mark.parametrize("qt", list(OWN_WIDTH), ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3, 4, 5, 13, 130])
def test_own_width_product_is_the_oracles(qt, T):
    """The product equals the dequantized matrix times the activations rounded per 32
    columns (Q5_0) or per 256 (Q4_K, Q6_K: their sub-block scales apply as integers) to
    f32 accuracy; the other rounding is measurably off, so the group is the one claimed."""
    t, wf, x = _product_case(qt, T)
    own = ci.from_gguf(qt, t.data, t.shape)
    assert own.kind == OWN_WIDTH[qt][0]
    out = np.empty((T, t.shape[0]), np.float32)
    ci.matmul(own, x, out)
    group = ci.rounding_group(own)
    assert group == (32 if qt == QT.Q5_0 else 256)
    assert close(out, ci.rounded(x, group) @ wf.T, tol=1e-6) < 1e-6
    other = np.abs(out - ci.rounded(x, 256 if group == 32 else 32) @ wf.T).max() / np.abs(out).max()
    assert other > 1e-5


@pytest.mark.parametrize("T", [1, 4, 5, 130])
def test_q5_0_at_its_width_is_the_widened_path_to_f32_rounding(T):
    """u5 and p8 (Q5_0 widened to int8) multiply the same rounded activations by the same
    codes in exact integers; only the float sums of their blocks run in another order."""
    t, _, x = _product_case(QT.Q5_0, T)
    own = ci.from_gguf(QT.Q5_0, t.data, t.shape)
    widened = ci.prepare(cq.repack(QT.Q5_0, t.data, t.shape))
    assert (own.kind, widened.kind) == OWN_WIDTH[QT.Q5_0]
    out, want = np.empty((T, t.shape[0]), np.float32), np.empty((T, t.shape[0]), np.float32)
    ci.matmul(own, x, out)
    ci.matmul(widened, x, want)
    assert close(out, want.astype(np.float64), tol=1e-6) < 1e-6


def _outer_product(w, x):
    """x [T, cols] @ w.T (u5, k4 or u6, rows % 16 == 0, T % 4 == 0) by int8_ir_outer's two
    kernels alone, called from Python: all rows converted, then every tile of 4 activation rows."""
    from zinfer.kernels.cpu_fast.int8 import ir_outer as int8_ir_outer
    from zinfer.kernels.cpu_fast.int8.activations import QUANTIZERS

    rows, T = w.qs.shape[0], x.shape[0]
    A, S, N, C = QUANTIZERS[ci.activation_order(w)](x, ci.rounding_group(w), w.nsteps, w.nchunks, True)
    convert, product = (int8_ir.SIGNATURE.ctypes_function(a) for a in int8_ir.outer_addresses(w.kind))
    per_step = int8_ir_outer.scratch_bytes_per_row_step(w.kind)
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


@pytest.mark.parametrize("qt", [QT.Q5_0, QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("T", [32, 70, 130])
def test_prefill_runs_as_outer_products_and_keeps_the_oracles_product(qt, T):
    """Tasks of int8_ir_outer.OUTER_MIN_ROWS (32) activation rows or more multiply Q5_0,
    Q4_K and Q6_K (rows a multiple of 16) by 8 weight rows a vector: the product is still the
    oracle's to f32 accuracy; its full tiles of 4 rows in such tasks are the outer kernels'
    bit for bit (the path is taken), and the rows after them the row kernels' (as alone)."""
    _, _, x = _product_case(qt, T)  # its activations: a zero block, a block 1e4 times the rest
    t = random_tensor(qt, 48, 512, seed=T)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    w = ci.from_gguf(qt, t.data, t.shape)
    out = np.empty((T, 48), np.float32)
    ci.matmul(w, x, out)
    assert close(out, ci.rounded(x, ci.rounding_group(w)) @ wf.T, tol=1e-6) < 1e-6
    # a task's activation rows are row_driver.ROWS_PER_BLOCK at most (128): 130's last 2 alone
    tiled = min(T, row_driver.ROWS_PER_BLOCK) // 4 * 4
    np.testing.assert_array_equal(out[:tiled], _outer_product(w, x[:tiled]))
    alone = np.empty((T - tiled, 48), np.float32)
    ci.matmul(w, x[tiled:], alone)
    np.testing.assert_array_equal(out[tiled:], alone)


@pytest.mark.parametrize("qt", list(RESIDENT), ids=lambda q: q.name)
def test_upload_keeps_only_the_files_width_and_embeds_its_rows_exactly(qt):
    rows, cols = 40, 768
    t = random_tensor(qt, rows, cols, seed=2)
    dev = FastCpuDevice()
    w = dev.upload("w", t)
    assert type(w) is fl.Int8Linear and w.int8.kind == RESIDENT[qt][0]
    assert w.packed is None and w.f32 is None  # no widened copy kept next to it
    assert w.nbytes * 8 / (rows * cols) == RESIDENT[qt][1]
    ids = np.array([0, 7, rows - 1, 7])
    np.testing.assert_array_equal(dev.embed(w, ids), dequantize(t.data, qt, t.shape)[ids])


# not whole 64-column steps; not whole 128-column groups
@pytest.mark.parametrize("cols, kind", [(96, "i8"), (576, "p8")])
def test_q5_0_rows_off_its_groups_keep_the_widened_kernel(cols, kind):
    t = random_tensor(QT.Q5_0, 9, cols, seed=3)
    w = FastCpuDevice().upload("w", t)
    assert w.int8.kind == kind and w.packed is None
    x = np.random.default_rng(0).standard_normal((3, cols), dtype=np.float32)
    wf = dequantize(t.data, QT.Q5_0, t.shape)
    close(w.compute(x), ci.rounded(x) @ wf.astype(np.float64).T)
    np.testing.assert_array_equal(FastCpuDevice().embed(w, np.array([8, 0])), wf[[8, 0]])


def test_matrices_of_one_activation_layout_share_a_launch_whatever_their_types():
    """Q8_0 (p8) and Q4_0 (u4) read activations in one order and rounding: one launch.
    Q5_0 (u5), Q4_K (k4, rounded per 256) and Q6_K (u6) read orders of their own
    (kernels/cpu_fast/int8/layouts.py): a launch each."""
    rows, cols = 40, 256
    types = (QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q4_0, QT.Q6_K)
    ws = tuple(FastCpuDevice().upload(str(i), random_tensor(qt, rows, cols, seed=i)) for i, qt in enumerate(types))
    assert [w.int8.kind for w in ws] == ["u5", "p8", "k4", "u4", "u6"]
    dev = FastCpuDevice()
    x = np.random.default_rng(0).standard_normal((5, cols), dtype=np.float32)
    outs = dev.linears(x, ws, (None,) * len(ws))
    assert sorted(m for _, m in dev.int8_jobs(ws)) == [[0], [1, 3], [2], [4]]
    for out, w in zip(outs, ws):
        np.testing.assert_array_equal(out, w.compute(x))


@pytest.fixture(scope="module")
def tiny_q5_0(tmp_path_factory):
    shape = dict(hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    return write_tiny_gguf(tmp_path_factory.mktemp("m") / "q5.gguf", "llama", qtype=QT.Q5_0, **shape)


def logits(path, dev) -> tuple[np.ndarray, set[str]]:
    """Logits [4, vocab] of a prefill and a decode step of two sequences on dev, and the int8 kinds its matrices got."""
    src = open_model(path)
    spec, w = src.spec, build_weights(src.spec, src.tensors, dev.upload)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 8, 16)
    first = round_logits(spec, w, dev, kv,
                         ForwardBatch.build([([1, 5, 9, 200, 7], 0, [0], True), ([3] * 20, 0, [1, 2], True)], 16))
    nxt = round_logits(spec, w, dev, kv, ForwardBatch.build([([11], 5, [0], True), ([12], 20, [1, 2], True)], 16))
    kinds = {m.int8.kind for m in _matrices(w) if getattr(m, "int8", None) is not None}
    return np.concatenate([first, nxt]), kinds


def _matrices(tree):
    """Every FastWeight in a model's weights (dataclasses, lists and tuples of them)."""
    if isinstance(tree, fl.FastWeight):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _matrices(item)
    elif hasattr(tree, "__dict__"):
        for item in vars(tree).values():
            yield from _matrices(item)


def test_a_q5_0_model_is_as_close_to_the_oracle_as_the_widened_path(tiny_q5_0, monkeypatch):
    """Layer after layer, f32 differences between u5 and p8 can flip an activation's int8
    rounding, so their logits differ by about that rounding; each is as far from the
    numpy oracle's (float activations) as the other."""
    own, kinds = logits(tiny_q5_0, FastCpuDevice())
    oracle, _ = logits(tiny_q5_0, CpuDevice())
    monkeypatch.setattr(ci, "from_gguf", lambda *a: None)  # every matrix through cpu_quant's repack: p8
    widened, widened_kinds = logits(tiny_q5_0, FastCpuDevice())
    assert (kinds, widened_kinds) == ({"u5"}, {"p8"})
    relative = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())  # noqa: E731
    assert relative(own, oracle) < 1.25 * relative(widened, oracle)
    assert relative(own, widened) < 0.02


@pytest.mark.parametrize("qt", list(OWN_WIDTH), ids=lambda q: q.name)
def test_converting_by_chunks_of_rows_gives_the_whole_matrixs_layout(qt, monkeypatch):
    t = random_tensor(qt, 37, 256, seed=5)
    whole = ci.from_gguf(qt, t.data, t.shape)
    monkeypatch.setattr(bp, "CHUNK_ROWS", 8)  # 37 rows: four whole chunks and a part
    chunked = ci.from_gguf(qt, t.data, t.shape)
    for a, b in zip(whole, chunked):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


_AVX2_PRODUCTS = """
import sys
import numpy as np
from gguf import GGMLQuantizationType as QT
sys.path.insert(0, sys.argv[1])
from test_cpu_fast import random_tensor
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.kernels.cpu_fast.int8 import products as ci, ir as int8_ir
from zinfer.kernels.oracle.quants import dequantize
assert int8_ir.host_isa() == "avx2", int8_ir.host_isa()
worst = 0.0
for qt, rows in ((QT.Q5_0, 37), (QT.Q5_0, 48), (QT.Q4_K, 37), (QT.Q4_K, 48), (QT.Q6_K, 37), (QT.Q6_K, 48), \
(QT.Q4_1, 37), (QT.Q8_0, 37)):
    t = random_tensor(qt, rows, 768, seed=7)  # 48 rows x 70: the outer-product tasks
    w = FastCpuDevice().upload("w", t)
    wf = dequantize(t.data, qt, t.shape).astype(np.float64)
    for T in (1, 5, 70):
        x = np.random.default_rng(T).standard_normal((T, 768), dtype=np.float32)
        want = ci.rounded(x, ci.rounding_group(w.int8)) @ wf.T
        err = float(np.abs(w.compute(x) - want).max() / np.abs(want).max())
        print(w.int8.kind, T, err)
        worst = max(worst, err)
print("worst", worst)
"""


@pytest.mark.skipif(int8_ir.host_isa() != "vnni", reason="runs the AVX2 kernels beside this host's VNNI ones")
def test_the_avx2_kernels_give_the_oracles_products_too(tmp_path):
    """On a VNNI host ZINFER_INT8_ISA=avx2 builds the kernels AVX2-only CPUs run (k4's int16
    pair sums, u5's and u4's paired vpmaddubsw): each product still equals the oracle's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, int8_ir.ISA_ENV: "avx2"}
    run = subprocess.run([sys.executable, "-c", _AVX2_PRODUCTS, str(Path(__file__).parent)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    kinds = {line.split()[0] for line in run.stdout.splitlines() if not line.startswith("worst")}
    assert kinds == {"u5", "k4", "u6", "u4", "p8"}
    assert float(run.stdout.split("worst")[-1]) < 1e-6, run.stdout
