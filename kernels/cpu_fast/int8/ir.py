"""int8 dot-product kernels (VNNI vpdpbusd, or AVX2's vpmaddubsw) written in LLVM IR and compiled by llvmlite.

numba's loop vectorizer does not turn int8 dot products into vpdpbusd (measured: 24
GMAC/s on one core with widening multiplies), and a C extension would need a compiler
at install. llvmlite is LLVM itself in a wheel (numba's dependency), so we write the
inner kernel as IR with the VNNI intrinsic and let LLVM do register allocation and
instruction selection for the host CPU. On AVX2 CPUs without VNNI the same kernels are
built with vpmaddubsw + vpmaddwd in its place (kernels/int8_ir_dot.py: the same integers and
the same float operations after them). Without either (`available()` False), the numba float
kernels of kernels/cpu_quant.py are used instead.

One kernel computes a tile: weight rows [r0, r1) times TILE activation rows from t0,
over `nsteps` steps of 8 int32 lanes each. Per step and lane, one or two vpdpbusd give
an exact integer dot of 4 or 8 products, and then, in float,

    acc[t] += float(int dot) * (d_w[lane] * S[t, lane])

so that the sum of the 8 lanes of acc[t] (plus u4's offsets) is out[t, r]. Three weight
layouts:

- u4: 64 weights per step in 32 bytes (two 32-blocks of kernels/cpu_quant's U4 layout:
  byte i of a block holds codes i and i + 16); activations int8 in the order
  [block0 0..15, block1 0..15, block0 16..31, block1 16..31]; d_w, m_w two numbers per
  step (lanes 0-3, 4-7).
- i8: 32 int8 weights per step against 32 int8 activations; vpdpbusd wants one operand
  unsigned, so it multiplies |w| by a * sign(w) (llama.cpp's trick); d_w one number per
  step (group 32) or two (group 16). No m_w.
- p8: i8 with group 32 in the u4 order (64 weights per step, bytes [block0 0..15,
  block1 0..15, block0 16..31, block1 16..31]): two vpdpbusd fill the same lanes, so
  the float work per weight is half of i8's (Gemma's Q5_0 prefill: the step loop is
  float-bound).

Two more read a type at the file's own width, codes unsigned with their high bits apart
(kernels/int8_layouts.py writes them): 8 or 16 bytes per step and weight row that
shifts per 64-bit lane and a mask spread to the bytes of the codes (int8_ir_scales.bit4s
and high_pairs), and the codes' offset (16 or 32 times the activations) is taken off in
the integers. That offset depends on the activations alone, so kernels/int8_activations.py
computes it once per activation row (C) instead of once per weight-row pass: on Zen 4
vpdpbusd, vpmaddubsw, vpmaddwd, vpmulld and the float multiplies all issue on the same two
pipes (measured: any mix of them runs at 2 a cycle), the budget every kernel here spends.

- u5 (Q5_0): 64 weights per step, 40 bytes: 32 nibble bytes, then 8 bytes of bit 4 of
  the low-nibble vector's 32 codes and of the high-nibble vector's; the columns in an
  order of their own over 128 (kernels/int8_layouts.U5_COLUMNS); d_w GGUF's f16 scales.
  5.5 bits per weight with the scales (p8: 8.5). Its kernel is kernels/int8_ir_blocks.py.
- u6 (Q6_K): 64 weights per step, 48 bytes, in an order of its own (two vectors whose
  byte k lies in the step's 16-group k // 8, kernels/int8_layouts.py): 32 nibble bytes,
  then 16 bytes of the codes' bits 4-5; D holds per super-block of 256 the f16 d and the
  16 int8 scales (18 bytes): 6.5625 bits per weight, the file's width (i8 with f32
  scales: 10).
- k4 (Q4_K): u4's nibbles, but D holds the file's scales per super-block of 256 (f16 d,
  f16 dmin, the 8 6-bit scales and 8 mins as bytes: 20 bytes): 4.625 bits per weight
  (u4 with f32 d and m: 6; the file: 4.5).

u6 and k4 have kernels of their own (kernels/int8_ir_super.py): their activations are
rounded per 256 columns, as llama.cpp's Q8_K, and their sub-block scales multiply the
integer sums, so the float work is once per super-block.

In prefill (a parallel task of 32 or more activation rows) u5, k4 and u6 run as outer
products instead (kernels/int8_ir_outer.py, OUTER_NAMES): the task converts its weight
rows once into 8 rows per vector (kernels/int8_ir_convert.py) and broadcasts the same
activations these row kernels read.

Scales are stored as f16 where that is exact (Q4_0, Q4_1, Q8_0, Q5_0 keep GGUF's own
f16 scales, so the kernels stream no more bytes than llama.cpp), else f32 (K-quants,
whose per-32 scales are products of two numbers).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

from zinfer.kernels.cpu_fast.int8 import ir_blocks as int8_ir_blocks, ir_convert as int8_ir_convert, ir_dot as int8_ir_dot, ir_outer as int8_ir_outer, ir_super as int8_ir_super
from zinfer.kernels.cpu_fast import code_cache, llvm_host
from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
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
    C: int  # address of u5's and u6's code offsets [T, nsteps * 32 bytes] (kernels/int8_activations.py; others: any readable address)
    nsteps: int  # 8-lane steps per row (>= 1)
    nchunks: int  # vectors of 8 blocks' offsets per row (u4)
    r0: int  # first weight row
    r1: int  # end of the weight rows (r1 - r0 a multiple of the kernel's rows)
    wstride: int  # bytes between weight rows
    dstride: int  # bytes between rows of D (and of M)
    t0: int  # first activation row
    t1: int  # end of the activation rows (int8_ir_outer's product: t1 - t0 a multiple of its tile; the others compute their tile from t0)
    astride: int  # bytes between rows of A
    sstride: int  # bytes between rows of S
    nstride: int  # bytes between rows of N
    cstride: int  # bytes between rows of C
    out: int  # address of out [T, ostride] f32
    ostride: int  # floats between rows of out


SIGNATURE = KernelSignature(Int8Args, addresses=("W", "D", "M", "A", "S", "N", "C", "out"))
ARGS = SIGNATURE.names
TILE = 4  # activation rows per tile in the wide kernels
ROWS = 2  # weight rows per pass in the wide kernels
# weights are prefetched this far ahead of the loads (rows are contiguous, so for short
# rows this reaches the next passes' rows). Against 1024, measured on a 2-core host with
# 42 GB/s read bandwidth: batch-1 decode per token Qwen2.5-1.5B (Q4_K/Q6_K) ~72 -> ~43 ms,
# Qwen2.5-0.5B ~24 -> ~21 ms, SmolLM2 ~7.8 -> ~5.9 ms; a 512-row Q4_K product 115 -> 169
# GMAC/s. 1024 had been measured against none: SmolLM2 8.0 -> 6.35 ms.
PREFETCH_BYTES = 16384
# llvm.prefetch's locality of those prefetches, by the kernel's activation rows. Batch-1
# products are bound by how fast one core pulls weights from DRAM: on an AMD EPYC (Zen 4)
# host prefetchnta (0) let a core stream ~11 GB/s of Q4_K and prefetcht1 (2, into L2) ~23
# (2 cores: 20-25 -> 30-36 GB/s of the 33 measured; Qwen2.5-1.5B batch-1 forward 55 -> 38-42 ms
# per token, 0.5B 24 -> 19-23). The wide (prefill) kernels keep 0: with 2, 512-row prefill
# showed no gain (SmolLM2 1010 -> 957 tok/s, the 0.5B 280 -> 272: inside this host's noise).
PREFETCH_LOCALITY = {1: 2, TILE: 0}
SHAPES = ((1, 1), (1, ROWS), (TILE, 1), (TILE, ROWS))  # (activation rows, weight rows) of the kernels
# (weight layout, d_w numbers per step, scales in f16); u5, u6 and k4 read the file's f16 scales
VARIANTS = tuple((k, d, h) for k, d in (("u4", 2), ("p8", 2), ("i8", 1), ("i8", 2)) for h in (True, False)) + (("u5", 2, True), ("u6", 2, True), ("k4", 2, True))
STEP64 = ("u4", "p8", "u5", "k4", "u6")  # the kinds of 64 columns per step (activations: u4's order; u5, u6, k4 their own)
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
    u4's offsets: out += sum over blocks of m_w * N, N [t, nchunks * 8] = d_a * sum(codes)
    per 32-block (zero-padded); it runs after the steps, 8 blocks per vector, instead of
    one more fma per step (which made the step loop float-bound).
    k4 and u6 are kernels/int8_ir_super.py's (the same contract, integer sub-block scales),
    u5 kernels/int8_ir_blocks.py's (a block per lane pair over 128 columns).
    """
    name = kernel_name(kind, dps, half, tile, rows)
    if kind in int8_ir_super.KINDS:
        return int8_ir_super.kernel_ir(kind, tile, rows, name, SIGNATURE, PREFETCH_BYTES, PREFETCH_LOCALITY[tile], STEP_BYTES[kind], isa)
    if kind == "u5":
        return int8_ir_blocks.kernel_ir(tile, rows, name, SIGNATURE, PREFETCH_BYTES, PREFETCH_LOCALITY[tile], isa)
    nibbles = kind == "u4"  # two 32-byte vectors of codes per step, from nibbles
    step64 = kind in STEP64
    pairs = [(i, t) for i in range(rows) for t in range(tile)]
    lines: list[str] = []
    e = lines.append
    frame.entry(e, SIGNATURE, name, tile)
    frame.row_pass(e, rows, "sloop")

    e("sloop:")  # over steps of 8 lanes
    e("  %s = phi i64 [ 0, %rloop ], [ %sn, %sloop ]")
    for i, t in pairs:
        e(f"  %acc{i}_{t} = phi {_F8} [ zeroinitializer, %rloop ], [ %accn{i}_{t}, %sloop ]")
    e(f"  %wo = mul i64 %s, {STEP_BYTES[kind]}")
    e(f"  %do = mul i64 %s, {dps * (2 if half else 4)}")
    for i in range(rows):
        e(f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %wo")
        e(f"  %w{i} = load <32 x i8>, ptr %wp{i}, align 1")
        e(f"  %pf{i} = getelementptr i8, ptr %wp{i}, i64 {PREFETCH_BYTES}")
        e(f"  call void @llvm.prefetch.p0(ptr %pf{i}, i32 0, i32 {PREFETCH_LOCALITY[tile]}, i32 1)")  # read, streamed once
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
    e(f"  %ao = shl i64 %s, {6 if step64 else 5}")
    e("  %so = shl i64 %s, 5")
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
        e(f"  %f{k} = sitofp {_I8} %ib{k} to {_F8}")
        e(f"  %ds{k} = fmul {_F8} %dx{i}, %sc{t}")
        e(f"  %accn{k} = call {_F8} @llvm.fma.v8f32({_F8} %f{k}, {_F8} %ds{k}, {_F8} %acc{k})")
    e("  %sn = add i64 %s, 1")
    e("  %more = icmp ult i64 %sn, %nsteps")
    if kind == "u4":
        e("  br i1 %more, label %sloop, label %mloop")
        accs = frame.offsets_loop(e, "u4", half, pairs, rows, tile, "sloop", "accn")
    else:
        e("  br i1 %more, label %sloop, label %rlatch")
        accs = "accn"
    frame.store(e, pairs, rows, accs)
    return "\n".join(lines)


KEYS = tuple((k, d, h, t, r) for k, d, h in VARIANTS for t, r in SHAPES)  # every kernel: (kind, dps, half, tile, rows)


# the outer-product prefill kernels (kernels/int8_ir_outer.py) of each kind: (convert, product)
OUTER_NAMES = {kind: (f"{kind}_outer_convert", f"{kind}_outer_t{TILE}") for kind in int8_ir_outer.OUTER_KINDS}


def module_ir(isa: str = "vnni") -> str:
    """IR of the module of every kernel of KEYS and OUTER_NAMES for an instruction set,
    "vnni" or "avx2" (int8_ir_dot), with the intrinsics' declarations."""
    outer = [text for kind, (convert, product) in OUTER_NAMES.items()
             for text in (int8_ir_convert.convert_ir(kind, convert, SIGNATURE), int8_ir_outer.product_ir(kind, product, SIGNATURE, TILE, isa))]
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


ISA_ENV = "ZINFER_INT8_ISA"  # "avx2": the AVX2 kernels on a VNNI host too (tests run them so)


@functools.cache
def host_isa() -> str | None:
    """The int8 kernels' instruction set on this machine ("vnni", "avx2"), or None;
    ZINFER_INT8_ISA=avx2 picks the AVX2 kernels where VNNI would run."""
    try:
        native = int8_ir_dot.host_isa(llvm_host.host_features())
    except (ImportError, RuntimeError, OSError):
        return None
    return "avx2" if native and os.environ.get(ISA_ENV) == "avx2" else native


def available() -> bool:
    """Whether the int8 kernels run on this machine."""
    return addresses() is not None
