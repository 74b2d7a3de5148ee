"""The int8 products on AMX tiles (Sapphire Rapids' AMX-INT8), written in LLVM IR on x86_amx
values and compiled by llvmlite, and a register-only loop that measures the tiles' peak.

One tdpbssd multiplies a tile of 16 activation rows by K bytes (A, signed codes as
activations.py rounds them) by a tile of K / 4 x 16 weight rows x 4 bytes (B, signed weight
codes in the VNNI layout, amx_layout.py) into 16 x 16 int32 sums (C[t, r]). The weights'
and activations' scales are per block of K columns (32; Q6_K's 16), so each block is one
tdpbssd with K = the block (exact integers), stored to a 1 KiB buffer and applied in float:

    acc[t] += float(C[t, :]) * (d_w[block, 16 rows] * d_a[t, block])   (+ m_w * N[t, block])

where acc[t] is a vector of 16 weight rows' sums, N = d_a times the activation codes' sum of
the block (the layouts with offsets m_w: Q4_1, Q4_K), as the VNNI kernels compute them
(ir.py). A kernel step is 32 weight rows by 32 activation rows: 2 A and 2 B tiles, 4
independent tdpbssd into 4 C tiles (one alone waits out the tiles' latency), their float
sums [2, 2, 16, 16] in a stack buffer (64 vectors: more than the 32 registers). Folding a
block's scale into requantized codes (one tdpbssd of K = 64) would change the numbers; the
float epilogue (a conversion, a multiply and an fma per 16 sums of 32 products) is the
cost of keeping them, and bounds the kernel well below the tiles' peak (BENCHMARKS.md).

Kernel contract (AmxArgs): out[t, r] for t in [t0, t1) and r in [r0, r1) (multiples of 32);
steps of 32 activation rows from t0, rows from t1 on computed but not stored (A, S, N must
be readable up to t0 + 32 * ceil((t1 - t0) / 32)). B: the weights' tiles, 16 weight rows at
B + (r / 16) * nblocks * 16 * block bytes; D and M: [rows / 16, nblocks, 16] f32.
"""

from __future__ import annotations

from typing import NamedTuple

from zinfer.kernels.cpu_fast.int8.ir_scales import Emit
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

RING = 4  # C tile buffers of a kernel (a power of 2, more than its blocks ahead)
TILE_ROWS = 16  # activation rows and weight rows of a C tile
BLOCKS = (32, 16)  # the K of a tile product: the columns that share a scale
DECLS = """
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbssd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)
"""
_F16 = "<16 x float>"
_I16 = "<16 x i32>"


def _broadcast(e: Emit, name: str, value: str) -> None:
    """%name = <16 x float> with the float `value` in every lane."""
    e(f"  %{name}i = insertelement {_F16} poison, float {value}, i32 0")
    e(f"  %{name} = shufflevector {_F16} %{name}i, {_F16} poison, <16 x i32> zeroinitializer")


class AmxArgs(NamedTuple):
    """The parameters of an AMX product kernel, in order: addresses, counts and byte strides."""

    B: int  # address of the weight tiles
    D: int  # address of the block scales [rows / 16, nblocks, 16] f32
    M: int  # address of the block offsets, as D (kernels without offsets: any readable address)
    A: int  # address of the int8 activations [T_pad, cols]
    S: int  # address of the activation scales [T_pad, nblocks] f32
    N: int  # address of the activation sums [T_pad, nblocks] f32 (d_a times the block's code sum)
    nblocks: int  # blocks per row (cols / block)
    r0: int  # first weight row (a multiple of 16)
    r1: int  # end of the weight rows (a multiple of 16)
    t0: int  # first activation row
    t1: int  # end of the activation rows
    astride: int  # bytes between rows of A
    sstride: int  # bytes between rows of S and of N
    out: int  # address of out [T, ostride] f32
    ostride: int  # floats between rows of out


SIGNATURE = KernelSignature(AmxArgs, addresses=("B", "D", "M", "A", "S", "N", "out"))


def kernel_name(block: int, offsets: bool) -> str:
    return f"amx_b{block}_{'m' if offsets else 'n'}"


KEYS = tuple((block, offsets) for block in BLOCKS for offsets in (False, True))  # every kernel: (block, offsets)


def kernel_ir(block: int, offsets: bool) -> str:
    """IR of the product kernel of `block` columns per scale, with or without offsets (the
    module docstring's contract): per step, 32 weight rows by 32 activation rows, 2 x 2 C
    tiles per block (independent tile products: one alone waits out the tiles' latency)."""
    lines: list[str] = []
    e = lines.append
    e(SIGNATURE.define(kernel_name(block, offsets)))
    e("entry:")
    for p in SIGNATURE.addresses:
        e(f"  %{p}p = inttoptr i64 %{p} to ptr")
    e("  %buf = alloca [4096 x i8], align 64")  # the 4 C tiles of a block
    e("  %accs = alloca [4096 x i8], align 64")  # the 4 tiles' float sums, [t tile][r tile][16][16]
    e(f"  %bstride = mul i64 %nblocks, {block * TILE_ROWS}")  # bytes of 16 weight rows' tiles
    e("  %dstride = shl i64 %nblocks, 6")  # bytes of 16 rows' scales
    e("  br label %rloop")
    e("rloop:")
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    e("  %rt = lshr i64 %r, 4")
    for j in range(2):
        e(f"  %rt{j} = add i64 %rt, {j}")
        e(f"  %bo{j} = mul i64 %rt{j}, %bstride")
        e(f"  %brow{j} = getelementptr i8, ptr %Bp, i64 %bo{j}")
        e(f"  %do{j} = mul i64 %rt{j}, %dstride")
        e(f"  %drow{j} = getelementptr i8, ptr %Dp, i64 %do{j}")
        e(f"  %mrow{j} = getelementptr i8, ptr %Mp, i64 %do{j}")
    e("  br label %tloop")
    e("tloop:")
    e("  %t = phi i64 [ %t0, %rloop ], [ %tn, %tlatch ]")
    e("  %so = mul i64 %t, %sstride")
    e("  %srow = getelementptr i8, ptr %Sp, i64 %so")
    e("  %nrow = getelementptr i8, ptr %Np, i64 %so")
    for i in range(2):
        e(f"  %ta{i}r = add i64 %t, {16 * i}")
        e(f"  %ao{i} = mul i64 %ta{i}r, %astride")
        e(f"  %arow{i} = getelementptr i8, ptr %Ap, i64 %ao{i}")
    for q in range(4 * TILE_ROWS):
        e(f"  %zp{q} = getelementptr i8, ptr %accs, i64 {64 * q}")
        e(f"  store {_F16} zeroinitializer, ptr %zp{q}, align 64")
    e("  br label %bloop")
    e("bloop:")
    e("  %b = phi i64 [ 0, %tloop ], [ %bn, %bloop ]")
    e(f"  %ab = mul i64 %b, {block}")
    e(f"  %bb = mul i64 %b, {block * TILE_ROWS}")
    for i in range(2):
        e(f"  %ap{i} = getelementptr i8, ptr %arow{i}, i64 %ab")
        e(f"  %ta{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 {block}, ptr %ap{i}, i64 %astride)")
    for j in range(2):
        e(f"  %bp{j} = getelementptr i8, ptr %brow{j}, i64 %bb")
        e(f"  %tb{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 {block // 4}, i16 64, ptr %bp{j}, i64 64)")
    for i in range(2):
        for j in range(2):
            c = f"{i}{j}"
            e(f"  %tz{c} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)")
            e(f"  %tc{c} = call x86_amx @llvm.x86.tdpbssd.internal(i16 16, i16 64, i16 {block}, x86_amx %tz{c}, "
              f"x86_amx %ta{i}, x86_amx %tb{j})")
    for i in range(2):
        for j in range(2):
            c = f"{i}{j}"
            e(f"  %cb{c} = getelementptr i8, ptr %buf, i64 {1024 * (2 * i + j)}")
            e(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %cb{c}, i64 64, x86_amx %tc{c})")
    e("  %db = shl i64 %b, 6")
    for j in range(2):
        e(f"  %dp{j} = getelementptr i8, ptr %drow{j}, i64 %db")
        e(f"  %dv{j} = load {_F16}, ptr %dp{j}, align 4")
        if offsets:
            e(f"  %mp{j} = getelementptr i8, ptr %mrow{j}, i64 %db")
            e(f"  %mv{j} = load {_F16}, ptr %mp{j}, align 4")
    e("  %sb = shl i64 %b, 2")
    for u in range(2 * TILE_ROWS):  # activation row t + u
        i = u // TILE_ROWS
        e(f"  %so{u} = mul i64 %sstride, {u}")
        e(f"  %sq{u} = add i64 %so{u}, %sb")
        e(f"  %sp{u} = getelementptr i8, ptr %srow, i64 %sq{u}")
        e(f"  %sa{u} = load float, ptr %sp{u}, align 4")
        _broadcast(e, f"sv{u}", f"%sa{u}")
        if offsets:
            e(f"  %np{u} = getelementptr i8, ptr %nrow, i64 %sq{u}")
            e(f"  %na{u} = load float, ptr %np{u}, align 4")
            _broadcast(e, f"nv{u}", f"%na{u}")
        for j in range(2):
            k = f"{u}_{j}"
            at = 1024 * (2 * i + j) + 64 * (u % TILE_ROWS)
            e(f"  %cp{k} = getelementptr i8, ptr %buf, i64 {at}")
            e(f"  %c{k} = load {_I16}, ptr %cp{k}, align 64")
            e(f"  %f{k} = sitofp {_I16} %c{k} to {_F16}")
            e(f"  %sc{k} = fmul {_F16} %dv{j}, %sv{u}")
            e(f"  %ap{k} = getelementptr i8, ptr %accs, i64 {at}")
            e(f"  %acc{k} = load {_F16}, ptr %ap{k}, align 64")
            last = "acs" if offsets else "accn"
            e(f"  %{last}{k} = call {_F16} @llvm.fma.v16f32({_F16} %f{k}, {_F16} %sc{k}, {_F16} %acc{k})")
            if offsets:
                e(f"  %accn{k} = call {_F16} @llvm.fma.v16f32({_F16} %mv{j}, {_F16} %nv{u}, {_F16} %acs{k})")
            e(f"  store {_F16} %accn{k}, ptr %ap{k}, align 64")
    e("  %bn = add i64 %b, 1")
    e("  %bmore = icmp ult i64 %bn, %nblocks")
    e("  br i1 %bmore, label %bloop, label %tlatch")
    e("tlatch:")
    e("  %left = sub i64 %t1, %t")
    for u in range(2 * TILE_ROWS):  # rows from t1 on are not stored
        i = u // TILE_ROWS
        e(f"  %ok{u} = icmp ult i64 {u}, %left")
        e(f"  %mk{u}i = insertelement <16 x i1> poison, i1 %ok{u}, i32 0")
        e(f"  %mk{u} = shufflevector <16 x i1> %mk{u}i, <16 x i1> poison, <16 x i32> zeroinitializer")
        e(f"  %ot{u} = add i64 %t, {u}")
        e(f"  %oo{u} = mul i64 %ot{u}, %ostride")
        for j in range(2):
            k = f"{u}_{j}"
            e(f"  %fp{k} = getelementptr i8, ptr %accs, i64 {1024 * (2 * i + j) + 64 * (u % TILE_ROWS)}")
            e(f"  %fin{k} = load {_F16}, ptr %fp{k}, align 64")
            e(f"  %oc{k} = add i64 %r, {16 * j}")
            e(f"  %oi{k} = add i64 %oo{u}, %oc{k}")
            e(f"  %op{k} = getelementptr float, ptr %outp, i64 %oi{k}")
            e(f"  call void @llvm.masked.store.v16f32.p0({_F16} %fin{k}, ptr %op{k}, i32 4, <16 x i1> %mk{u})")
    e("  %tn = add i64 %t, 32")
    e("  %tmore = icmp slt i64 %tn, %t1")
    e("  br i1 %tmore, label %tloop, label %rlatch")
    e("rlatch:")
    e("  %rn = add i64 %r, 32")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %rloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(lines)


def module_ir() -> str:
    """IR of the module of every kernel of KEYS, with the intrinsics' declarations."""
    return DECLS + "\n".join(kernel_ir(*key) for key in KEYS)


PEAK_TILES = 4  # independent C tiles of the peak loop (2 x 2, as a product's tiles would be)


def peak_ir() -> str:
    """void amx_peak(i64 n, ptr scratch): n iterations of PEAK_TILES tdpbssd (16 x 16 x 64)
    on tiles loaded once from scratch (>= 4 KiB), then the C tiles stored back there; the
    tiles' register-only throughput, 16 * 16 * 64 MACs each."""
    lines = [DECLS, "define void @amx_peak(i64 %n, ptr %buf) {", "entry:"]
    e = lines.append
    for k in range(2):
        e(f"  %p{k} = getelementptr i8, ptr %buf, i64 {1024 * k}")
        e(f"  %a{k} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %p{k}, i64 64)")
        e(f"  %b{k} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %p{k}, i64 64)")
    for c in range(PEAK_TILES):
        e(f"  %z{c} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)")
    e("  br label %loop")
    e("loop:")
    e("  %i = phi i64 [ 0, %entry ], [ %in, %loop ]")
    for c in range(PEAK_TILES):
        e(f"  %c{c} = phi x86_amx [ %z{c}, %entry ], [ %d{c}, %loop ]")
    for c in range(PEAK_TILES):
        e(f"  %d{c} = call x86_amx @llvm.x86.tdpbssd.internal(i16 16, i16 64, i16 64, x86_amx %c{c}, "
          f"x86_amx %a{c // 2}, x86_amx %b{c % 2})")
    e("  %in = add i64 %i, 1")
    e("  %more = icmp ult i64 %in, %n")
    e("  br i1 %more, label %loop, label %done")
    e("done:")
    for c in range(PEAK_TILES):
        e(f"  %q{c} = getelementptr i8, ptr %buf, i64 {1024 * c}")
        e(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %q{c}, i64 64, x86_amx %d{c})")
    e("  ret void")
    e("}")
    return "\n".join(lines)


PEAK_MACS_PER_ITERATION = PEAK_TILES * 16 * 16 * 64
