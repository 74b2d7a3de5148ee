"""The int8 row kernels (VNNI vpdpbusd, or AVX2's vpmaddubsw) written in LLVM IR and
compiled by llvmlite for the host CPU, and the module of every int8 kernel.

numba's loop vectorizer does not turn int8 dot products into vpdpbusd, and a C extension
would need a compiler at install; llvmlite is LLVM itself in a wheel (numba's
dependency), so the inner kernels are IR with the VNNI intrinsic and LLVM does register
allocation and instruction selection. On AVX2 CPUs without VNNI the same kernels are built
with vpmaddubsw + vpmaddwd in its place (ir_dot.py: the same integers and the same float
operations after them). `available()` says whether they run here.

The weight layouts and activation orders they read are the table of products.py. One
kernel computes a tile: weight rows [r0, r1) times `tile` activation rows from t0, over
`nsteps` steps of 8 int32 lanes each (Int8Args). Per step and lane, one or two vpdpbusd
give an exact integer dot of 4 or 8 products; the lanes of each block add up (exactly) and
its scales apply in float in the one order every int8 path shares (ir_order.py;
tests/int8_canonical.py states it), so a result does not depend on the path. This module
writes the u4, p8 and i8 kernels; u5's are ir_blocks.py's (f16 scales once per 4 blocks),
k4's and u6's ir_super.py's (sub-block scales applied to the integer sums, once per
super-block), the prefill outer products ir_outer.py's and ir_convert.py's (OUTER_NAMES).
Every int8 kernel shares the integer and float budget of two pipes on Zen 4 (vpdpbusd,
vpmaddubsw, vpmaddwd, vpmulld and the float multiplies issue on the same two): the
layouts exist to spend fewer float operations per product.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

from zinfer.kernels.cpu_fast.int8 import amx_host, ir_blocks
from zinfer.kernels.cpu_fast.int8 import ir_convert
from zinfer.kernels.cpu_fast.int8 import ir_dot
from zinfer.kernels.cpu_fast.int8 import ir_outer
from zinfer.kernels.cpu_fast.int8 import ir_super
from zinfer.kernels.cpu_fast import code_cache, llvm_host
from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8 import ir_order as order
from zinfer.kernels.cpu_fast.int8.ir_dot import DECLS as DOT_DECLS
from zinfer.kernels.cpu_fast.int8.ir_dot import dot, dot2_small
from zinfer.kernels.cpu_fast.int8.ir_scales import scale_vector, splat
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature


class Int8Args(NamedTuple):
    """The parameters of every int8 kernel, in order: addresses, counts and byte strides."""

    W: int  # address of weight row 0 (codes)
    D: int  # address of row 0's d_w scales
    M: int  # address of row 0's m_w offsets (u4; others: any readable address)
    A: int  # address of the int8 activations [T, cols]
    S: int  # address of the activation scales [T, nsteps * 8] f32
    N: int  # address of u4's offset sums [T, nchunks * 8] f32
    C: int  # address of u5's and u6's code offsets [T, nsteps * 32 bytes] (others: any readable address)
    nsteps: int  # 8-lane steps per row (>= 1)
    nchunks: int  # vectors of 8 blocks' offsets per row (u4)
    r0: int  # first weight row
    r1: int  # end of the weight rows (r1 - r0 a multiple of the kernel's rows)
    wstride: int  # bytes between weight rows
    dstride: int  # bytes between rows of D (and of M)
    t0: int  # first activation row
    t1: int  # end of the activation rows (ir_outer's product: t1 - t0 a multiple of its tile; others: at most a tile)
    astride: int  # bytes between rows of A
    sstride: int  # bytes between rows of S
    nstride: int  # bytes between rows of N
    cstride: int  # bytes between rows of C
    out: int  # address of out [T, ostride] f32
    ostride: int  # floats between rows of out


SIGNATURE = KernelSignature(Int8Args, addresses=("W", "D", "M", "A", "S", "N", "C", "out"))
ARGS = SIGNATURE.names
TILE = 4  # activation rows per tile in the widest row kernels and the outer products
ROWS = 2  # weight rows per pass in the wide kernels
# weights are prefetched this far ahead of the loads (rows are contiguous, so for short
# rows this reaches the next passes' rows); BENCHMARKS.md, kernels/cpu_fast/int8/ir.py, has the measurements
PREFETCH_BYTES = 16384
# llvm.prefetch's locality of those prefetches, by the kernel's activation rows: batch-1 products
# are bound by how fast one core pulls weights from DRAM, and prefetcht1 (2, into L2) pulls faster
# than prefetchnta (0). The wide kernels (rounds of 4 to 31 rows: batched decode, verify rounds)
# too: on Sapphire Rapids prefetchnta left them 2-3x slower per row than the batch-1 kernels
# (BENCHMARKS.md); on Zen 4, where they were first measured, 2 and 0 were even
PREFETCH_LOCALITY = {1: 2, 2: 2, TILE: 2}
# (activation rows, weight rows) of the kernels: tiles of 4 serve rounds of 3 rows too (ir_frame.entry),
# tiles of 2 rounds of 2 and 6 (a few sequences' decode, speculative verify rounds), the weights decoded once a tile
SHAPES = ((1, 1), (1, ROWS), (2, 1), (2, ROWS), (TILE, 1), (TILE, ROWS))
# (weight layout, d_w numbers per step, scales in f16); u5, u6 and k4 read the file's f16 scales
VARIANTS = tuple((k, d, h) for k, d in (("u4", 2), ("p8", 2), ("i8", 1), ("i8", 2)) for h in (True, False)) + (
    ("u5", 2, True),
    ("u6", 2, True),
    ("k4", 2, True),
)
STEP64 = ("u4", "p8", "u5", "k4", "u6")  # the kinds of 64 columns per step (activations: u4's order or their own)
ORDERED = ("u4", "p8")  # this module's kinds whose float steps follow ir_order (i8: no other path takes it)
STEP_BYTES = {"u4": 32, "p8": 64, "i8": 32, "u5": 40, "u6": 48, "k4": 32}  # weight bytes per step and row

_DECLS = """
declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)
declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
"""

_F8 = "<8 x float>"
_I8 = "<8 x i32>"


def kernel_name(kind: str, dps: int, half: bool, tile: int, rows: int) -> str:
    return f"{kind}_d{dps}_{'h' if half else 'f'}_t{tile}_r{rows}"


def kernel_ir(kind: str, dps: int, half: bool, tile: int, rows: int, isa: str = "vnni") -> str:
    """IR of one kernel: void(i64 x 18) with the parameters of Int8Args (addresses and byte strides).

    It computes out[t0 + t, r] for t < tile and r in [r0, r1), `rows` weight rows per
    pass (r1 - r0 a multiple of rows). Per pass and step, each weight row is decoded once
    and each activation row loaded once for all rows x tile dot products; the weights
    PREFETCH_BYTES ahead are prefetched (the hardware prefetcher alone left batch-1
    decode short of the memory bandwidth).
    u4 and p8: lanes 0-3 hold the step's first block, 4-7 its second; per block
    acc = fma(f32(I), d_w * d_a, acc) into its class (the block's parity), and u4's offsets
    then acc = fma(m_w, N, acc), N [t, nchunks * 8] = d_a * sum(codes) per 32-block (ir_order).
    i8 (no other path takes it) sums its 8 lanes' floats as it always did.
    k4 and u6 are kernels/ir_super.py's (the same contract, integer sub-block scales),
    u5 kernels/ir_blocks.py's (a block per lane pair over 128 columns).
    """
    name = kernel_name(kind, dps, half, tile, rows)
    if kind in ir_super.KINDS:
        locality = PREFETCH_LOCALITY[tile]
        return ir_super.kernel_ir(kind, tile, rows, name, SIGNATURE, PREFETCH_BYTES, locality, STEP_BYTES[kind], isa)
    if kind == "u5":
        return ir_blocks.kernel_ir(tile, rows, name, SIGNATURE, PREFETCH_BYTES, PREFETCH_LOCALITY[tile], isa)
    nibbles = kind == "u4"  # two 32-byte vectors of codes per step, from nibbles
    step64 = kind in STEP64
    pairs = [(i, t) for i in range(rows) for t in range(tile)]
    lines: list[str] = []
    e = lines.append
    frame.entry(e, SIGNATURE, name, tile)
    frame.row_pass(e, rows, "sloop")

    ordered = kind in ORDERED  # one exact integer per block, then the shared float order (ir_order)
    accs = [f"%acc{k}" for k in range(order.count(len(pairs), 4))] if ordered else []
    e("sloop:")  # over steps of 8 lanes
    e("  %s = phi i64 [ 0, %rloop ], [ %sn, %sloop ]")
    for a, acc in enumerate(accs):
        e(f"  {acc} = phi {_F8} [ zeroinitializer, %rloop ], [ %sum{a}, %sloop ]")
    for i, t in pairs if not ordered else []:
        e(f"  %acc{i}_{t} = phi {_F8} [ zeroinitializer, %rloop ], [ %accn{i}_{t}, %sloop ]")
    e(f"  %wo = mul i64 %s, {STEP_BYTES[kind]}")
    e(f"  %do = mul i64 %s, {dps * (2 if half else 4)}")
    for i in range(rows):
        e(f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %wo")
        e(f"  %w{i} = load <32 x i8>, ptr %wp{i}, align 1")
        e(f"  %pf{i} = getelementptr i8, ptr %wp{i}, i64 {PREFETCH_BYTES}")
        locality = PREFETCH_LOCALITY[tile]
        e(f"  call void @llvm.prefetch.p0(ptr %pf{i}, i32 0, i32 {locality}, i32 1)")  # read, streamed once
        if nibbles:
            e(f"  %lo{i} = and <32 x i8> %w{i}, {splat(32, 'i8', 15)}")
            e(f"  %hi{i} = lshr <32 x i8> %w{i}, {splat(32, 'i8', 4)}")
            e(f"  %lo32{i} = bitcast <32 x i8> %lo{i} to {_I8}")
            e(f"  %hi32{i} = bitcast <32 x i8> %hi{i} to {_I8}")
        else:
            e(f"  %wabs{i} = call <32 x i8> @llvm.abs.v32i8(<32 x i8> %w{i}, i1 false)")
            e(f"  %wabs32{i} = bitcast <32 x i8> %wabs{i} to {_I8}")
        if kind == "p8":  # the step's second 32 bytes
            e(f"  %wq{i} = getelementptr i8, ptr %wp{i}, i64 32")
            e(f"  %wh{i} = load <32 x i8>, ptr %wq{i}, align 1")
            e(f"  %whabs{i} = call <32 x i8> @llvm.abs.v32i8(<32 x i8> %wh{i}, i1 false)")
            e(f"  %whabs32{i} = bitcast <32 x i8> %whabs{i} to {_I8}")
        scale_vector(e, f"dx{i}", f"%drow{i}", "%do", dps, half)
        if kind == "u4":  # the step's 2 blocks' offsets m_w, as d_w
            scale_vector(e, f"mx{i}", f"%mrow{i}", "%do", dps, half)
    e(f"  %ao = shl i64 %s, {6 if step64 else 5}")
    e("  %so = shl i64 %s, 5")
    e("  %no = shl i64 %s, 3")  # u4's N: 2 floats a step
    for t in range(tile):
        e(f"  %ap{t} = getelementptr i8, ptr %arow{t}, i64 %ao")
        e(f"  %sp{t} = getelementptr i8, ptr %srow{t}, i64 %so")
        e(f"  %sc{t} = load {_F8}, ptr %sp{t}, align 4")
        if nibbles:
            e(f"  %alo{t} = load {_I8}, ptr %ap{t}, align 1")
            e(f"  %aph{t} = getelementptr i8, ptr %ap{t}, i64 32")
            e(f"  %ahi{t} = load {_I8}, ptr %aph{t}, align 1")
        else:
            e(f"  %a{t} = load <32 x i8>, ptr %ap{t}, align 1")
        if kind == "p8":
            e(f"  %aph{t} = getelementptr i8, ptr %ap{t}, i64 32")
            e(f"  %ah{t} = load <32 x i8>, ptr %aph{t}, align 1")
        if kind == "u4":  # the step's 2 blocks' N (d_a times their code sums), as S's lanes
            scale_vector(e, f"nv{t}", f"%nrow{t}", "%no", 2, False)
    for i, t in pairs:
        k = f"{i}_{t}"
        if nibbles:
            dot2_small(e, isa, f"ib{k}", "zeroinitializer", f"%lo32{i}", f"%alo{t}", f"%hi32{i}", f"%ahi{t}")
        else:  # |w| times a * sign(w)
            e(f"  %as{k} = call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> %a{t}, <32 x i8> %w{i})")
            e(f"  %as32{k} = bitcast <32 x i8> %as{k} to {_I8}")
            last = "ib" if kind == "i8" else "ia"
            dot(e, isa, f"{last}{k}", "zeroinitializer", f"%wabs32{i}", f"%as32{k}")
        if kind == "p8":  # both blocks' second halves into the same lanes
            e(f"  %ahs{k} = call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> %ah{t}, <32 x i8> %wh{i})")
            e(f"  %ahs32{k} = bitcast <32 x i8> %ahs{k} to {_I8}")
            dot(e, isa, f"ib{k}", f"%ia{k}", f"%whabs32{i}", f"%ahs32{k}")
        if not ordered:
            e(f"  %f{k} = sitofp {_I8} %ib{k} to {_F8}")
            e(f"  %ds{k} = fmul {_F8} %dx{i}, %sc{t}")
            e(f"  %accn{k} = call {_F8} @llvm.fma.v8f32({_F8} %f{k}, {_F8} %ds{k}, {_F8} %acc{k})")
    if ordered:  # lanes 0-3: the step's first block (class 0), 4-7: its second (class 1)
        reduced = order.reduce_runs(e, "rd", [f"%ib{i}_{t}" for i, t in pairs], 4)
        made: order.Made = {}
        ds = order.scaled(e, "ds", reduced, lambda p, c: (f"%dx{pairs[p][0]}", 4 * c),
                          lambda p, c: (f"%sc{pairs[p][1]}", 4 * c), made)
        sums = order.fma_into(e, "sb" if kind == "u4" else "sum", order.as_floats(e, "fi", reduced), ds, accs)
        if kind == "u4":  # acc = fma(m_w, N, acc), block by block
            offsets = [order.gather(e, "mv", [None if lb is None else (f"%mx{pairs[lb[0]][0]}", 4 * lb[1])
                                              for lb in r.labels], made) for r in reduced]
            code_sums = [order.gather(e, "nv", [None if lb is None else (f"%nv{pairs[lb[0]][1]}", 4 * lb[1])
                                                for lb in r.labels], made) for r in reduced]
            order.fma_into(e, "sum", offsets, code_sums, sums)
    e("  %sn = add i64 %s, 1")
    e("  %more = icmp ult i64 %sn, %nsteps")
    e("  br i1 %more, label %sloop, label %rlatch")
    if ordered:
        e("rlatch:")
        order.store(e, reduced, accs_after(len(reduced)), pairs, 2)
        frame.latch(e, rows)
    else:
        frame.store(e, pairs, rows, "accn")
    return "\n".join(lines)


def accs_after(n: int) -> list[str]:
    """The names of the step loop's n class sums after its last step."""
    return [f"%sum{k}" for k in range(n)]


KEYS = tuple((k, d, h, t, r) for k, d, h in VARIANTS for t, r in SHAPES)  # every kernel: (kind, dps, half, tile, rows)


# the outer-product prefill kernels (ir_outer.py) of each kind: (convert, product)
OUTER_NAMES = {kind: (f"{kind}_outer_convert", f"{kind}_outer_t{TILE}") for kind in ir_outer.OUTER_KINDS}


def module_ir(isa: str = "vnni") -> str:
    """IR of the module of every kernel of KEYS and OUTER_NAMES for an instruction set,
    "vnni" or "avx2" (ir_dot), with the intrinsics' declarations."""
    outer = [
        text
        for kind, (convert, product) in OUTER_NAMES.items()
        for text in (
            ir_convert.convert_ir(kind, convert, SIGNATURE),
            ir_outer.product_ir(kind, product, SIGNATURE, TILE, isa),
        )
    ]
    return _DECLS + DOT_DECLS + "\n".join([kernel_ir(*key, isa=isa) for key in KEYS] + outer)


@functools.cache
def _compiled() -> dict[str, int] | None:
    """Machine-code address of every kernel of the module by name; None when the host CPU
    has neither AVX512-VNNI nor AVX2 or llvmlite cannot compile for it."""
    try:
        isa = host_isa()
        if isa is None:
            return None
        outer = [name for names in OUTER_NAMES.values() for name in names]
        names = [kernel_name(*key) for key in KEYS] + outer
        return llvm_host.compile_for_host(module_ir(isa), names, cache_dir=code_cache.llvm_dir())
    except (RuntimeError, OSError):
        return None


def addresses() -> dict[tuple[str, int, bool, int, int], int] | None:
    """Machine-code addresses of every kernel of KEYS, (kind, dps, half, tile, rows) -> address; None
    where the int8 kernels do not run."""
    addr = _compiled()
    return None if addr is None else {key: addr[kernel_name(*key)] for key in KEYS}


def outer_addresses(kind: str) -> tuple[int, int] | None:
    """The addresses of a layout's outer-product prefill kernels (convert, product), or None
    (no such kernels for `kind`, or no int8 kernels here)."""
    addr = _compiled()
    if addr is None or kind not in OUTER_NAMES:
        return None
    convert, product = OUTER_NAMES[kind]
    return addr[convert], addr[product]


# "avx2": the AVX2 kernels on a VNNI host too (tests run them so); amx_host.KERNELS_ENV=avx2 does the same
ISA_ENV = amx_host.ISA_ENV


@functools.cache
def host_isa() -> str | None:
    """The int8 kernels' instruction set on this machine ("vnni", "avx2"), or None;
    ZINFER_INT8_ISA=avx2 picks the AVX2 kernels where VNNI would run."""
    try:
        native = ir_dot.host_isa(llvm_host.host_features())
    except (ImportError, RuntimeError, OSError):
        return None
    forced = os.environ.get(ISA_ENV) == "avx2" or os.environ.get(amx_host.KERNELS_ENV) == "avx2"
    return "avx2" if native and forced else native


def available() -> bool:
    """Whether the int8 kernels run on this machine."""
    return addresses() is not None
