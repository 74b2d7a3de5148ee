"""The k4 (Q4_K) and u6 (Q6_K) kernels: the file's sub-block scales applied as integers,
as llama.cpp's K-quant kernels apply them.

Their activations are rounded to int8 per 256 columns (one scale d_a per super-block, as
llama.cpp's Q8_K), so a super-block's sum needs no float until its end. vpmaddubsw gives
the int16 pair sums of codes by activations, and vpmaddwd by the sub-block scales of
their columns (as int16) sums them into 8 int32 lanes already scaled (u6: per step; k4:
once per super-block); then, once per 256 columns and pair of weight row and activation
row, the 8 lanes add into the super-block's exact integer I and (ir_order's shared order)

    acc = fma(f32(I), d_w * d_a, acc)   (k4 then: acc = fma(f32(M), -dmin * d_a, acc))

where the kernels of ir.py convert, multiply and fma per step. u6 runs the
same instructions on AVX2 and AVX-512 hosts (no VNNI needed); k4 uses VNNI where it can.

Both read 4 steps of 64 columns per super-block, a low- and a high-nibble vector each:

- k4, in its order (products.py's table; layouts.K4_COLUMNS, and its activations'):
  bytes 4b..4b + 3 of every vector of the super-block lie in its 32-block b. With VNNI,
  int32 lane b of each (weight row, activation row) sums block b over the super-block
  by 2 vpdpbusd a step, and one vpmulld by the blocks' 6-bit scales gives the scaled sums
  (|.| <= 63 * 32 * 15 * 127 < 2^22): 8 vpdpbusd and 1 vpmulld per super-block, where 8
  vpmaddubsw, 4 vpmaddwd and their adds had been (on Zen 4 the integer dot products, the
  multiplies and the float multiplies share two pipes). On AVX2, int16 lane l of every
  vpmaddubsw pair sum belongs to block l // 2: the pair sums of all 8 vectors add up in
  int16 (|.| <= 16 * 15 * 127 = 30480), then one vpmaddwd by the scales (lanes [s0, s0,
  s1, s1, ..., s7, s7]). The mins: M = the sum over blocks of min * the activations'
  code sum (C, integers; vpmulld), once per super-block.
- u6, in its order (products.py's table; layouts.U6_LOW, U6_HIGH, and its activations'):
  byte k of both vectors lies in the step's 16-group k // 8, so their pair sums add
  before one vpmaddwd by the 4 groups' int8 scales. Codes 0..63 are the file's plus 32,
  so the sum is that of the codes by a minus that of 32 by a (each exact in int16, <= 4
  * 63 * 127 = 32004; the difference |.| <= 4 * 32 * 127 = 16256); over a super-block a
  lane sums 32 products, |.| <= 32 * 32 * 127 * 128 < 2^24.

Every integer is exact and under 2^24 over a super-block, so float(isum) is exact: the
output is the oracle's sum of dequantized weights times the rounded activations, up to
f32 rounding of the scale products and of the sums across super-blocks.
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8 import ir_order as order
from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, K4_SUPER_BYTES, U6_SUPER_BYTES, high_pairs, shuffle_mask, splat
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

KINDS = ("k4", "u6")
SUPER_STEPS = 4  # steps of 64 columns per super-block of 256
SUPER_SHIFT = 2  # log2 of SUPER_STEPS
SUPER_BYTES = {"k4": K4_SUPER_BYTES, "u6": U6_SUPER_BYTES}  # D per super-block

_F8 = "<8 x float>"
_I8 = "<8 x i32>"
_B32 = "<32 x i8>"
_W16 = "<16 x i16>"
_MADDUBS = "@llvm.x86.avx2.pmadd.ub.sw"  # declared in ir_dot.DECLS
_MADDWD = "@llvm.x86.avx2.pmadd.wd"
_VPDPBUSD = "@llvm.x86.avx512.vpdpbusd.256"


def _pairs(e: Emit, name: str, u: str, s: str) -> None:
    """%name = <16 x i16>: the pair sums of u's unsigned by s's signed bytes (vpmaddubsw)."""
    e(f"  %{name} = call {_W16} {_MADDUBS}({_B32} {u}, {_B32} {s})")


def kernel_ir(
    kind: str,
    tile: int,
    rows: int,
    name: str,
    signature: KernelSignature,
    prefetch: int,
    locality: int,
    step_bytes: int,
    isa: str = "vnni",
) -> str:
    """IR of the kernel `name` of kind k4 or u6 for `tile` activation rows and `rows` weight
    rows per pass (ir.kernel_ir's contract; nsteps a multiple of SUPER_STEPS), prefetching
    weights `prefetch` bytes ahead with llvm.prefetch's `locality`; `isa` as ir_dot's
    (k4's integer sums: vpdpbusd with "vnni", else vpmaddubsw)."""
    n = SUPER_STEPS
    pairs = [(i, t) for i in range(rows) for t in range(tile)]
    lines: list[str] = []
    meta: list[str] = []
    e = lines.append
    frame.entry(e, signature, name, tile)
    frame.row_pass(e, rows, "bloop")

    latch = "jdone" if kind == "k4" else "bloop"  # the super-block's last block
    e("bloop:")  # over super-blocks
    e(f"  %b = phi i64 [ 0, %rloop ], [ %bn, %{latch} ]")
    accs = [f"%acc{k}" for k in range(order.count(len(pairs), 8))]
    for k, acc in enumerate(accs):
        e(f"  {acc} = phi {_F8} [ zeroinitializer, %rloop ], [ %sum{k}, %{latch} ]")
    e(f"  %bs = shl i64 %b, {SUPER_SHIFT}")  # its first step
    # the super-block's f16 d_w and sub-block scales as int16 (k4: 8, in both 128-bit halves; u6: 16)
    for i in range(rows):
        e(f"  %dof{i} = mul i64 %b, {SUPER_BYTES[kind]}")
        e(f"  %dp{i} = getelementptr i8, ptr %drow{i}, i64 %dof{i}")
        e(f"  %dh{i} = load half, ptr %dp{i}, align 1")
        e(f"  %df{i} = fpext half %dh{i} to float")
        if kind == "k4":
            e(f"  %scp{i} = getelementptr i8, ptr %dp{i}, i64 4")
            e(f"  %scb{i} = load <8 x i8>, ptr %scp{i}, align 1")
            if isa == "vnni":  # int32 lane b: block b's
                e(f"  %scr{i} = zext <8 x i8> %scb{i} to {_I8}")
            else:  # int16 lanes 2b, 2b + 1: block b's
                e(f"  %scw{i} = zext <8 x i8> %scb{i} to <8 x i16>")
                doubled = shuffle_mask([g // 2 for g in range(16)])
                e(f"  %scr{i} = shufflevector <8 x i16> %scw{i}, <8 x i16> poison, <16 x i32> {doubled}")
        else:
            e(f"  %scp{i} = getelementptr i8, ptr %dp{i}, i64 2")
            e(f"  %scb{i} = load <16 x i8>, ptr %scp{i}, align 1")
            e(f"  %scr{i} = sext <16 x i8> %scb{i} to {_W16}")
    for t in range(tile):  # the super-block's d_a: lane 0 of its first step in S
        e(f"  %so{t} = shl i64 %b, {SUPER_SHIFT + 5}")
        e(f"  %sp{t} = getelementptr i8, ptr %srow{t}, i64 %so{t}")
        e(f"  %sa{t} = load float, ptr %sp{t}, align 4")
    if kind == "k4":
        _k4_steps(e, meta, rows, tile, pairs, prefetch, locality, isa)
    else:
        for j in range(n):
            _u6_step(e, j, rows, tile, pairs, prefetch, locality, step_bytes)
    _super_block_sums(e, kind, rows, tile, pairs, accs)
    e("  %bn = add i64 %b, 1")
    e(f"  %nsup = lshr i64 %nsteps, {SUPER_SHIFT}")
    e("  %more = icmp ult i64 %bn, %nsup")
    e("  br i1 %more, label %bloop, label %rlatch")
    e("rlatch:")
    order.store(e, order.reduce_runs(lambda _: None, "ri", ["%v"] * len(pairs), 8),
                [f"%sum{k}" for k in range(len(accs))], pairs, 1)
    frame.latch(e, rows)
    return "\n".join(lines + meta)


def _broadcast(e: Emit, name: str, value: str) -> None:
    """%name = <8 x float> with the float `value` in every lane."""
    e(f"  %{name}i = insertelement {_F8} poison, float {value}, i64 0")
    e(f"  %{name} = shufflevector {_F8} %{name}i, {_F8} poison, <8 x i32> zeroinitializer")


def _super_block_sums(e: Emit, kind: str, rows: int, tile: int, pairs: list[tuple[int, int]], accs: list[str]) -> None:
    """The super-block's float work in the shared order (ir_order): per pair its exact
    integer I = the sum of its 8 lanes %is3_{i}_{t} (sub-block sums times their scales), then
    acc = fma(f32(I), d_w * d_a, acc); k4 then acc = fma(f32(M), -dmin * d_a, acc) with M =
    sum over its blocks of min * the activations' code sum (C). Defines %sum{k}."""
    n = SUPER_STEPS
    reduced = order.reduce_runs(e, "ri", [f"%is{n - 1}_{i}_{t}" for i, t in pairs], 8)
    for i in range(rows):
        _broadcast(e, f"dfv{i}", f"%df{i}")
    for t in range(tile):
        _broadcast(e, f"sav{t}", f"%sa{t}")
    made: order.Made = {}
    ds = order.scaled(e, "ds", reduced, lambda p, c: (f"%dfv{pairs[p][0]}", 0),
                      lambda p, c: (f"%sav{pairs[p][1]}", 0), made)
    first = order.fma_into(e, "sb" if kind == "k4" else "sum", order.as_floats(e, "fi", reduced), ds, accs)
    if kind != "k4":
        return
    for i in range(rows):  # the 8 blocks' 6-bit mins (at + 12) and -dmin (the f16 at + 2)
        e(f"  %mnp{i} = getelementptr i8, ptr %dp{i}, i64 12")
        e(f"  %mnb{i} = load <8 x i8>, ptr %mnp{i}, align 1")
        e(f"  %mn{i} = zext <8 x i8> %mnb{i} to {_I8}")
        e(f"  %dmp{i} = getelementptr i8, ptr %dp{i}, i64 2")
        e(f"  %dmh{i} = load half, ptr %dmp{i}, align 1")
        e(f"  %dmf{i} = fpext half %dmh{i} to float")
        e(f"  %dmn{i} = fneg float %dmf{i}")
        _broadcast(e, f"dmv{i}", f"%dmn{i}")
    for t in range(tile):  # the 8 blocks' activation code sums, C[t, 8b ..]
        e(f"  %cso{t} = shl i64 %b, 5")
        e(f"  %csp{t} = getelementptr i8, ptr %crow{t}, i64 %cso{t}")
        e(f"  %cs{t} = load {_I8}, ptr %csp{t}, align 4")
    for i, t in pairs:
        e(f"  %mm{i}_{t} = mul {_I8} %mn{i}, %cs{t}")
    mins = order.reduce_runs(e, "rm", [f"%mm{i}_{t}" for i, t in pairs], 8)
    dm = order.scaled(e, "dm", mins, lambda p, c: (f"%dmv{pairs[p][0]}", 0),
                      lambda p, c: (f"%sav{pairs[p][1]}", 0), made)
    order.fma_into(e, "sum", order.as_floats(e, "fm", mins), dm, first)


def _k4_steps(
    e: Emit, meta: list[str], rows: int, tile: int, pairs: list[tuple[int, int]], prefetch: int, locality: int, isa: str
) -> None:
    """k4's 4 steps of a super-block as a loop (blocks jloop, then jdone): %is3_{i}_{t} = the
    super-block's scaled int32 lanes, lane b: 32-block b's sum times its 6-bit scale.

    In the k4 order every 4 bytes of a vector lie in one block (layouts.py), so
    with VNNI each step is 2 vpdpbusd per pair into its int32 lanes, and the scales
    multiply once per super-block (vpmulld). AVX2: vpmaddubsw pair sums added in int16
    (lane l: block l // 2) and one vpmaddwd by the scales. A loop, never unrolled
    (frame.never_unrolled; unrolled, it spilled 48 times a super-block)."""
    acc = _I8 if isa == "vnni" else _W16
    e("  br label %jloop")
    e("jloop:")
    e("  %j = phi i64 [ 0, %bloop ], [ %jn, %jloop ]")
    for i, t in pairs:
        e(f"  %qa{i}_{t} = phi {acc} [ zeroinitializer, %bloop ], [ %q{i}_{t}, %jloop ]")
    e("  %sj = add i64 %bs, %j")
    e("  %wo = shl i64 %sj, 5")  # 32 bytes a step
    for i in range(rows):
        e(f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %wo")
        e(f"  %pf{i} = getelementptr i8, ptr %wp{i}, i64 {prefetch}")
        e(f"  call void @llvm.prefetch.p0(ptr %pf{i}, i32 0, i32 {locality}, i32 1)")  # read, streamed once
        e(f"  %w{i} = load {_B32}, ptr %wp{i}, align 1")
        e(f"  %lo{i} = and {_B32} %w{i}, {splat(32, 'i8', 15)}")
        e(f"  %hi{i} = lshr {_B32} %w{i}, {splat(32, 'i8', 4)}")
    e("  %ao = shl i64 %sj, 6")
    for t in range(tile):
        e(f"  %ap{t} = getelementptr i8, ptr %arow{t}, i64 %ao")
        e(f"  %alo{t} = load {_B32}, ptr %ap{t}, align 1")
        e(f"  %aph{t} = getelementptr i8, ptr %ap{t}, i64 32")
        e(f"  %ahi{t} = load {_B32}, ptr %aph{t}, align 1")
    for i, t in pairs:
        k = f"{i}_{t}"
        if isa == "vnni":
            for v in ("lo", "hi"):
                e(f"  %{v}u{k} = bitcast {_B32} %{v}{i} to {_I8}")
                e(f"  %{v}s{k} = bitcast {_B32} %a{v}{t} to {_I8}")
            e(f"  %ql{k} = call {_I8} {_VPDPBUSD}({_I8} %qa{k}, {_I8} %lou{k}, {_I8} %los{k})")
            e(f"  %q{k} = call {_I8} {_VPDPBUSD}({_I8} %ql{k}, {_I8} %hiu{k}, {_I8} %his{k})")
        else:  # summed in int16 over the super-block (modular adds; the total fits)
            _pairs(e, f"pl{k}", f"%lo{i}", f"%alo{t}")
            _pairs(e, f"ph{k}", f"%hi{i}", f"%ahi{t}")
            e(f"  %p{k} = add {_W16} %pl{k}, %ph{k}")
            e(f"  %q{k} = add {_W16} %qa{k}, %p{k}")
    e("  %jn = add i64 %j, 1")
    e(f"  %jmore = icmp ult i64 %jn, {SUPER_STEPS}")
    e(f"  br i1 %jmore, label %jloop, label %jdone, {frame.never_unrolled(meta)}")
    e("jdone:")
    for i, t in pairs:  # by the blocks' scales
        if isa == "vnni":
            e(f"  %is{SUPER_STEPS - 1}_{i}_{t} = mul {_I8} %q{i}_{t}, %scr{i}")
        else:
            e(f"  %is{SUPER_STEPS - 1}_{i}_{t} = call {_I8} {_MADDWD}({_W16} %q{i}_{t}, {_W16} %scr{i})")


def _u6_step(
    e: Emit,
    j: int,
    rows: int,
    tile: int,
    pairs: list[tuple[int, int]],
    prefetch: int,
    locality: int,
    step_bytes: int,
) -> None:
    """u6's step j of the super-block: %is{j}_{i}_{t} = %is{j-1}_{i}_{t} + its scaled int32 lanes."""
    e(f"  %s{j} = add i64 %bs, {j}")
    e(f"  %wo{j} = mul i64 %s{j}, {step_bytes}")
    for i in range(rows):
        w = f"{i}_{j}"
        e(f"  %wp{w} = getelementptr i8, ptr %wrow{i}, i64 %wo{j}")
        e(f"  %pf{w} = getelementptr i8, ptr %wp{w}, i64 {prefetch}")
        e(f"  call void @llvm.prefetch.p0(ptr %pf{w}, i32 0, i32 {locality}, i32 1)")  # read, streamed once
        e(f"  %w{w} = load {_B32}, ptr %wp{w}, align 1")
        e(f"  %lo{w} = and {_B32} %w{w}, {splat(32, 'i8', 15)}")
        e(f"  %hi{w} = lshr {_B32} %w{w}, {splat(32, 'i8', 4)}")
        # codes 0..63: bits 4-5 from their fields; int16 lane l: the scale of group 4j + l // 4
        high_pairs(e, f"hl{w}", f"hh{w}", f"%wp{w}", 32)
        e(f"  %qlo{w} = or {_B32} %lo{w}, %hl{w}")
        e(f"  %qhi{w} = or {_B32} %hi{w}, %hh{w}")
        spread = shuffle_mask([4 * j + g for g in range(4) for _ in range(4)])
        e(f"  %sc{w} = shufflevector {_W16} %scr{i}, {_W16} poison, <16 x i32> {spread}")
    for t in range(tile):
        a = f"{t}_{j}"
        e(f"  %ao{a} = shl i64 %s{j}, 6")
        e(f"  %ap{a} = getelementptr i8, ptr %arow{t}, i64 %ao{a}")
        e(f"  %alo{a} = load {_B32}, ptr %ap{a}, align 1")
        e(f"  %aph{a} = getelementptr i8, ptr %ap{a}, i64 32")
        e(f"  %ahi{a} = load {_B32}, ptr %aph{a}, align 1")
        # the codes' offset: 32 * a in pairs, both vectors', from C
        e(f"  %co{a} = shl i64 %s{j}, 5")
        e(f"  %cp{a} = getelementptr i8, ptr %crow{t}, i64 %co{a}")
        e(f"  %m{a} = load {_W16}, ptr %cp{a}, align 2")
    for i, t in pairs:
        k, w, a = f"{i}_{t}", f"{i}_{j}", f"{t}_{j}"
        _pairs(e, f"pl{j}_{k}", f"%qlo{w}", f"%alo{a}")
        _pairs(e, f"ph{j}_{k}", f"%qhi{w}", f"%ahi{a}")
        e(f"  %p{j}_{k} = add {_W16} %pl{j}_{k}, %ph{j}_{k}")
        e(f"  %po{j}_{k} = sub {_W16} %p{j}_{k}, %m{a}")
        scaled = f"call {_I8} {_MADDWD}({_W16} %po{j}_{k}, {_W16} %sc{w})"
        if j == 0:
            e(f"  %is0_{k} = {scaled}")
        else:
            e(f"  %x{j}_{k} = {scaled}")
            e(f"  %is{j}_{k} = add {_I8} %is{j - 1}_{k}, %x{j}_{k}")
