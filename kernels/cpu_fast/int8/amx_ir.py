"""The int8 products on AMX tiles (Sapphire Rapids' AMX-INT8), written in LLVM IR on x86_amx
values and compiled by llvmlite, and a register-only loop that measures the tiles' peak.

One tdpbssd multiplies a tile of 16 activation rows by K bytes (A, signed codes as
activations.py rounds them) by a tile of K / 4 x 16 weight rows x 4 bytes (B, the weight
codes in the VNNI layout, amx_layout.py) into 16 x 16 exact int32 sums (C[t, r]). K is one
block of 32 columns (Q6_K: a sub-block of 16). The sums then take the float steps of the one
int8 order (tests/int8_canonical.py, the spec every int8 path equals bit for bit), per kind:

- u4, p8, u5 (blocks of 32, C classes: 2, 2, 4): block b goes into the class buffer b % C,
      acc[b % C] = fma(f32(C_b), d_b * d_a_b, acc[b % C])
      acc[b % C] = fma(m_b, d_a_b * f32(codesum_b), acc[b % C])        (u4 only)
  and out = ((acc[0] + acc[1]) + acc[2]) + acc[3], left to right over the C classes.
- k4, u6 (super-blocks of 256): amx_ir_folded.py.

Each product above is one f32 multiply, each fma rounds once (no fast-math flags here), d_a
is the activations' scale of the block and codesum the exact sum of its activation codes.
A kernel step is 32 weight rows by 32 activation rows: 2 A and 2 B tiles, 4 independent
tdpbssd into 4 C tiles (one alone waits out the tiles' latency), stored to a 4 KiB buffer;
the float sums [2, 2, 16, 16] of each class live in stack buffers (64 vectors each: more
than the 32 registers).

Kernel contract (AmxArgs): out[t, r] for t in [t0, t1) and r in [r0, r1) (multiples of 32);
steps of 32 activation rows from t0, rows from t1 on computed but not stored (A, S, N must
be readable up to t0 + 32 * ceil((t1 - t0) / 32)). B: the weights' tiles, 16 weight rows at
B + (r / 16) * nblocks * 16 * K bytes; D, M as amx_layout.AmxWeight's arrays (L, MN, CS: the folded kernels').
"""

from __future__ import annotations

from typing import NamedTuple

from zinfer.kernels.cpu_fast.int8.ir_scales import Emit
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

TILE_ROWS = 16  # activation rows and weight rows of a C tile
KINDS = ("u4", "p8", "u5")  # amx_layout's kinds of blocks of 32, one kernel each (k4, u6: amx_ir_folded)
CLASSES = {"u4": 2, "p8": 2, "u5": 4}  # accumulator classes of the kinds of blocks of 32
DECLS = """
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbssd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)
"""
F16 = "<16 x float>"  # the IR types and fma of the kernels' 16-lane vectors
I16 = "<16 x i32>"
FMA = f"call {F16} @llvm.fma.v16f32"


def _broadcast(e: Emit, name: str, value: str) -> None:
    """%name = <16 x float> with the float `value` in every lane."""
    e(f"  %{name}i = insertelement {F16} poison, float {value}, i32 0")
    e(f"  %{name} = shufflevector {F16} %{name}i, {F16} poison, <16 x i32> zeroinitializer")


def load_scalar(e: Emit, name: str, row: str, stride: str, u: int, index: str) -> None:
    """%name = <16 x float> broadcast of the float at row + u * stride + index * 4 (bytes)."""
    e(f"  %{name}o = mul i64 %{stride}, {u}")
    e(f"  %{name}x = shl i64 {index}, 2")
    e(f"  %{name}q = add i64 %{name}o, %{name}x")
    e(f"  %{name}p = getelementptr i8, ptr %{row}, i64 %{name}q")
    e(f"  %{name}s = load float, ptr %{name}p, align 4")
    _broadcast(e, name, f"%{name}s")


def _at(u: int, j: int) -> int:
    """Byte offset of activation row t + u's vector of weight rows r + 16 j in a [2, 2, 16, 16] buffer."""
    return 1024 * (2 * (u // TILE_ROWS) + j) + 64 * (u % TILE_ROWS)


class AmxArgs(NamedTuple):
    """The parameters of an AMX product kernel, in order: addresses, counts and byte strides."""

    B: int  # address of the weight tiles (k4, u6: hi)
    L: int  # k4, u6: address of the lo tiles; others: any readable address
    D: int  # address of the scales d (amx_layout.AmxWeight.d)
    M: int  # address of the offsets (u4: m, k4: -dmin; other kinds: any readable address)
    MN: int  # k4: address of the sub-block mins' B tiles; others: any readable address
    A: int  # address of the int8 activations [T_pad, cols]
    S: int  # address of the activation scales [T_pad, cols / group] f32
    N: int  # address of the activations' [T_pad, cols / 32] f32: u4, d_a * code sum (others: unread)
    CS: int  # address of the activations' split code sums [T_pad, cols / 256, 16] int8 (k4; others: unread)
    nblocks: int  # tile products per row (cols / K)
    r0: int  # first weight row (a multiple of 16)
    r1: int  # end of the weight rows (a multiple of 16)
    t0: int  # first activation row
    t1: int  # end of the activation rows
    astride: int  # bytes between rows of A
    sstride: int  # bytes between rows of S
    nstride: int  # bytes between rows of N
    csstride: int  # bytes between rows of CS
    out: int  # address of out [T, ostride] f32
    ostride: int  # floats between rows of out


SIGNATURE = KernelSignature(AmxArgs, addresses=("B", "L", "D", "M", "MN", "A", "S", "N", "CS", "out"))


def kernel_name(kind: str) -> str:
    return f"amx_{kind}"


def open_kernel(e: Emit, kind: str) -> None:
    """The kernel of `kind`'s define line and entry block's first lines: each address
    parameter P as the pointer %Pp."""
    e(SIGNATURE.define(kernel_name(kind)))
    e("entry:")
    for p in SIGNATURE.addresses:
        e(f"  %{p}p = inttoptr i64 %{p} to ptr")


def kernel_ir(kind: str) -> str:
    """IR of the product kernel of `kind` (u4, p8, u5: the module docstring's order and
    contract): per step, 32 weight rows by 32 activation rows, 2 x 2 C tiles per block."""
    block, classes = 32, CLASSES[kind]
    lines: list[str] = []
    e = lines.append
    open_kernel(e, kind)
    e("  %buf = alloca [4096 x i8], align 64")  # the 4 C tiles of a tile product
    e(f"  %accs = alloca [{4096 * classes} x i8], align 64")  # float sums per class, [class][2][2][16][16]
    e(f"  %bstride = mul i64 %nblocks, {block * TILE_ROWS}")  # bytes of 16 weight rows' tiles
    e("  %dstride = shl i64 %nblocks, 6")  # bytes of 16 rows' d (and m)
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
    e("  %no = mul i64 %t, %nstride")
    e("  %nrow = getelementptr i8, ptr %Np, i64 %no")
    for i in range(2):
        e(f"  %ta{i}r = add i64 %t, {16 * i}")
        e(f"  %ao{i} = mul i64 %ta{i}r, %astride")
        e(f"  %arow{i} = getelementptr i8, ptr %Ap, i64 %ao{i}")
    for q in range(4 * TILE_ROWS * classes):
        e(f"  %zp{q} = getelementptr i8, ptr %accs, i64 {64 * q}")
        e(f"  store {F16} zeroinitializer, ptr %zp{q}, align 64")
    e("  br label %bloop")
    e("bloop:")
    e("  %b = phi i64 [ 0, %tloop ], [ %bn, %bnext ]")
    _tile_products(e, block)
    _block(e, kind, classes)
    e("  br label %bnext")
    e("bnext:")
    e("  %bn = add i64 %b, 1")
    e("  %bmore = icmp ult i64 %bn, %nblocks")
    e("  br i1 %bmore, label %bloop, label %tlatch")
    e("tlatch:")
    _store(e, classes)
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


def _tile_products(e: Emit, block: int) -> None:
    """The 2 x 2 tile products of block %b (K = block columns) into %buf's 4 C tiles."""
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


def _block(e: Emit, kind: str, classes: int) -> None:
    """Block %b's float steps into its class's buffer (u4, p8, u5)."""
    e(f"  %cls = and i64 %b, {classes - 1}")
    e("  %clo = shl i64 %cls, 12")
    e("  %abase = getelementptr i8, ptr %accs, i64 %clo")
    e("  %db = shl i64 %b, 6")
    for j in range(2):
        e(f"  %dp{j} = getelementptr i8, ptr %drow{j}, i64 %db")
        e(f"  %dv{j} = load {F16}, ptr %dp{j}, align 4")
        if kind == "u4":
            e(f"  %mp{j} = getelementptr i8, ptr %mrow{j}, i64 %db")
            e(f"  %mv{j} = load {F16}, ptr %mp{j}, align 4")
    for u in range(2 * TILE_ROWS):  # activation row t + u
        load_scalar(e, f"sv{u}", "srow", "sstride", u, "%b")
        if kind == "u4":  # N_b = f32(d_a * f32(code sum)), from the activations
            load_scalar(e, f"nv{u}", "nrow", "nstride", u, "%b")
        for j in range(2):
            k = f"{u}_{j}"
            e(f"  %cp{k} = getelementptr i8, ptr %buf, i64 {_at(u, j)}")
            e(f"  %c{k} = load {I16}, ptr %cp{k}, align 64")
            e(f"  %f{k} = sitofp {I16} %c{k} to {F16}")
            e(f"  %sc{k} = fmul {F16} %dv{j}, %sv{u}")
            e(f"  %ap{k} = getelementptr i8, ptr %abase, i64 {_at(u, j)}")
            e(f"  %acc{k} = load {F16}, ptr %ap{k}, align 64")
            last = "acs" if kind == "u4" else "accn"
            e(f"  %{last}{k} = {FMA}({F16} %f{k}, {F16} %sc{k}, {F16} %acc{k})")
            if kind == "u4":
                e(f"  %accn{k} = {FMA}({F16} %mv{j}, {F16} %nv{u}, {F16} %acs{k})")
            e(f"  store {F16} %accn{k}, ptr %ap{k}, align 64")


def _store(e: Emit, classes: int) -> None:
    """The step's out rows below t1: the classes' sums added left to right."""
    e("  %left = sub i64 %t1, %t")
    for u in range(2 * TILE_ROWS):  # rows from t1 on are not stored
        e(f"  %ok{u} = icmp ult i64 {u}, %left")
        e(f"  %mk{u}i = insertelement <16 x i1> poison, i1 %ok{u}, i32 0")
        e(f"  %mk{u} = shufflevector <16 x i1> %mk{u}i, <16 x i1> poison, <16 x i32> zeroinitializer")
        e(f"  %ot{u} = add i64 %t, {u}")
        e(f"  %oo{u} = mul i64 %ot{u}, %ostride")
        for j in range(2):
            k = f"{u}_{j}"
            total = ""
            for c in range(classes):
                e(f"  %fp{k}_{c} = getelementptr i8, ptr %accs, i64 {4096 * c + _at(u, j)}")
                e(f"  %fv{k}_{c} = load {F16}, ptr %fp{k}_{c}, align 64")
                if c:
                    e(f"  %fs{k}_{c} = fadd {F16} {total}, %fv{k}_{c}")
                total = f"%fs{k}_{c}" if c else f"%fv{k}_{c}"
            e(f"  %oc{k} = add i64 %r, {16 * j}")
            e(f"  %oi{k} = add i64 %oo{u}, %oc{k}")
            e(f"  %op{k} = getelementptr float, ptr %outp, i64 %oi{k}")
            e(f"  call void @llvm.masked.store.v16f32.p0({F16} {total}, ptr %op{k}, i32 4, <16 x i1> %mk{u})")


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
