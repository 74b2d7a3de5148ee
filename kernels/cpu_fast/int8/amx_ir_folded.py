"""The AMX products of the K-quants (k4: Q4_K, u6: Q6_K) on folded codes, in LLVM IR.

amx_layout.py folds each weight's sub-block scale into its code, w = sc_j * code = 64 hi + lo,
so a super-block's integer sum of the one int8 order (tests/int8_canonical.py),
Isum = sum over j of sc_j * (codes . activations)_j, is 64 H + L where H and L are tile
products over the super-block's 256 columns (4 tdpbssd of K = 64 each, summed in the tiles):
the same integer, with no per-sub-block work outside the tiles. k4's
Msum = sum over j of mn_j * codesum_j is a tile product too: the activations' exact code sums
of the 8 sub-blocks, split codesum = 64 ch + cl (ch -64..63, cl 0..63: int8, amx_products
rounds them), times the mins' B tile, Msum = 64 Mh + Ml. Then, once per super-block,
the float steps of the order:
    acc = fma(f32(Isum), d * d_a, acc)
    acc = fma(f32(Msum), (-dmin) * d_a, acc)                          (k4 only)
and out = acc: bit for bit the VNNI kernels' (and amx_ir's block kinds' contract).

A kernel step is 16 weight rows by 32 activation rows: 2 A tiles and the hi and lo B tiles
into 4 C tiles (A0 hi, A0 lo, A1 hi, A1 lo: all 8 tile registers), stored once per
super-block, with k4's 4 min tiles, to one 8 KiB half of a buffer while the float steps of
the super-block before read the other half; the float sums [32, 16] live in a stack buffer.
Kernel contract: amx_ir's (AmxArgs), with B the hi tiles, L the lo tiles, nblocks = cols /
64, MN k4's min tiles (readable 1 KiB past the last) and CS the activations' split code sums
[T_pad, cols / 256, 2, 64] int8 (ch of the 8 sub-blocks, then 56 zeros; cl the same).
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8.amx_ir import F16, FMA, I16, TILE_ROWS, load_scalar, open_kernel
from zinfer.kernels.cpu_fast.int8.ir_scales import Emit

KINDS = ("k4", "u6")
CHUNKS = 4  # tile products of K = 64 per super-block of 256 columns
_C = ("0h", "0l", "1h", "1l")  # the 4 C tiles: activation tile 0/1 x hi/lo, their order in %buf


def kernel_ir(kind: str) -> str:
    """IR of the folded product kernel of `kind` (k4 or u6), the module docstring's steps."""
    mins = kind == "k4"
    lines: list[str] = []
    e = lines.append
    open_kernel(e, kind)
    e("  %buf = alloca [16384 x i8], align 64")  # 2 x C tiles [8][16][16] i32: _C, then k4's Mh0, Ml0, Mh1, Ml1
    e("  %accs = alloca [2048 x i8], align 64")  # float sums [32][16]
    e("  %bstride = shl i64 %nblocks, 10")  # bytes of 16 weight rows' hi (or lo) tiles: 1 KiB a block
    e(f"  %nsup = udiv i64 %nblocks, {CHUNKS}")
    e("  %dstride = shl i64 %nsup, 6")  # bytes of 16 rows' d (and m): 16 floats a super-block
    e("  %mnstride = shl i64 %nsup, 7")  # bytes of 16 rows' min tiles: 2 x 64 a super-block
    e("  br label %rloop")
    e("rloop:")
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    e("  %rt = lshr i64 %r, 4")
    for name, stride, base in (("hrow", "bstride", "Bp"), ("lrow", "bstride", "Lp"), ("drow", "dstride", "Dp"),
                               ("mrow", "dstride", "Mp"), ("mnrow", "mnstride", "MNp")):
        e(f"  %{name}o = mul i64 %rt, %{stride}")
        e(f"  %{name} = getelementptr i8, ptr %{base}, i64 %{name}o")
    e("  br label %tloop")
    e("tloop:")
    e("  %t = phi i64 [ %t0, %rloop ], [ %tn, %tlatch ]")
    e("  %so = mul i64 %t, %sstride")
    e("  %srow = getelementptr i8, ptr %Sp, i64 %so")
    for i in range(2):
        e(f"  %ta{i}r = add i64 %t, {16 * i}")
        e(f"  %ao{i} = mul i64 %ta{i}r, %astride")
        e(f"  %arow{i} = getelementptr i8, ptr %Ap, i64 %ao{i}")
        e(f"  %co{i} = mul i64 %ta{i}r, %csstride")
        e(f"  %csrow{i} = getelementptr i8, ptr %CSp, i64 %co{i}")
    for q in range(2 * TILE_ROWS):
        e(f"  %zp{q} = getelementptr i8, ptr %accs, i64 {64 * q}")
        e(f"  store {F16} zeroinitializer, ptr %zp{q}, align 64")
    # super-block s's tiles go to %buf's half s % 2 while the float steps of s - 1 read the other
    # half: the tile unit runs ahead of the vector ports' work on the sums
    _tiles(e, "0", mins, "p")
    e("  %one = icmp ugt i64 %nsup, 1")
    e("  br i1 %one, label %sloop, label %last")
    e("sloop:")
    e("  %s = phi i64 [ 1, %tloop ], [ %sn, %sloop ]")
    e("  %sp = sub i64 %s, 1")
    _tiles(e, "%s", mins, "c")
    _float_steps(e, "%sp", mins, "c")
    e("  %sn = add i64 %s, 1")
    e("  %smore = icmp ult i64 %sn, %nsup")
    e("  br i1 %smore, label %sloop, label %last")
    e("last:")
    e("  %sl = sub i64 %nsup, 1")
    _float_steps(e, "%sl", mins, "l")
    e("  br label %tlatch")
    e("tlatch:")
    _store(e)
    e("  %tn = add i64 %t, 32")
    e("  %tmore = icmp slt i64 %tn, %t1")
    e("  br i1 %tmore, label %tloop, label %rlatch")
    e("rlatch:")
    e("  %rn = add i64 %r, 16")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %rloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(lines)


def _tiles(e: Emit, s: str, mins: bool, tag: str) -> None:
    """Super-block `s`'s tile products into the %buf half `s` % 2 (k4: the min tiles first;
    after the 4 C tiles, when they had K = 8 shapes, LLVM's tile allocator ran out of registers)."""
    e(f"  %par{tag} = and i64 {s}, 1")
    e(f"  %half{tag} = shl i64 %par{tag}, 13")
    e(f"  %hb{tag} = getelementptr i8, ptr %buf, i64 %half{tag}")
    if mins:
        _min_tiles(e, s, tag)
    _super_block_tiles(e, s, tag)


def _super_block_tiles(e: Emit, s: str, tag: str) -> None:
    """Super-block `s`'s H and L of both activation tiles, summed over its CHUNKS blocks in
    the 4 C tiles, stored to %hb{tag} in _C's order."""
    prev: dict[str, str] = {}
    e(f"  %sk{tag} = mul i64 {s}, {CHUNKS}")
    for k in range(CHUNKS):
        n = f"{k}{tag}"
        e(f"  %blk{n} = add i64 %sk{tag}, {k}")
        e(f"  %ab{n} = shl i64 %blk{n}, 6")
        e(f"  %bb{n} = shl i64 %blk{n}, 10")
        for i in range(2):
            e(f"  %ap{i}_{n} = getelementptr i8, ptr %arow{i}, i64 %ab{n}")
            e(f"  %ta{i}_{n} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %ap{i}_{n}, "
              f"i64 %astride)")
        for half, row in (("h", "hrow"), ("l", "lrow")):
            e(f"  %bp{half}_{n} = getelementptr i8, ptr %{row}, i64 %bb{n}")
            e(f"  %tb{half}_{n} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %bp{half}_{n}, "
              f"i64 64)")
        for c in _C:
            if c not in prev:
                e(f"  %tz{c}{tag} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)")
                prev[c] = f"%tz{c}{tag}"
            e(f"  %tc{c}_{n} = call x86_amx @llvm.x86.tdpbssd.internal(i16 16, i16 64, i16 64, x86_amx {prev[c]}, "
              f"x86_amx %ta{c[0]}_{n}, x86_amx %tb{c[1]}_{n})")
            prev[c] = f"%tc{c}_{n}"
    for q, c in enumerate(_C):
        e(f"  %cb{c}{tag} = getelementptr i8, ptr %hb{tag}, i64 {1024 * q}")
        e(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %cb{c}{tag}, i64 64, x86_amx {prev[c]})")


def _min_tiles(e: Emit, s: str, tag: str) -> None:
    """k4: Mh and Ml of super-block `s` for both activation tiles (the split code sums times
    the mins), stored to %hb{tag} after the 4 C tiles (Mh0, Ml0, Mh1, Ml1). Every tile here
    has the C tiles' shape (16 x 64 bytes), so that one tile configuration serves the whole
    kernel: a CS row holds 8 sums and 56 zeros, so B rows past the 2 of the mins count nothing."""
    e(f"  %mno{tag} = shl i64 {s}, 7")
    e(f"  %mnp{tag} = getelementptr i8, ptr %mnrow, i64 %mno{tag}")
    e(f"  %tmn{tag} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %mnp{tag}, i64 64)")
    e(f"  %cso{tag} = shl i64 {s}, 7")
    for i in range(2):
        for n, half in enumerate("hl"):
            m = f"{half}{i}{tag}"
            e(f"  %csq{m} = add i64 %cso{tag}, {64 * n}")
            e(f"  %csp{m} = getelementptr i8, ptr %csrow{i}, i64 %csq{m}")
            e(f"  %tcs{m} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %csp{m}, i64 %csstride)")
            e(f"  %tmz{m} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)")
            e(f"  %tm{m} = call x86_amx @llvm.x86.tdpbssd.internal(i16 16, i16 64, i16 64, x86_amx %tmz{m}, "
              f"x86_amx %tcs{m}, x86_amx %tmn{tag})")
            e(f"  %mb{m} = getelementptr i8, ptr %hb{tag}, i64 {1024 * (4 + 2 * i + n)}")
            e(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %mb{m}, i64 64, x86_amx %tm{m})")


def _split_sum(e: Emit, name: str, base: str, hi_offset: int, lo_offset: int) -> None:
    """%name = <16 x float> f32(64 hi + lo) of the int32 vectors at base + the offsets."""
    for half, offset in (("h", hi_offset), ("l", lo_offset)):
        e(f"  %{name}{half}p = getelementptr i8, ptr {base}, i64 {offset}")
        e(f"  %{name}{half} = load {I16}, ptr %{name}{half}p, align 64")
    e(f"  %{name}s = shl {I16} %{name}h, {_splat(6)}")
    e(f"  %{name}i = add {I16} %{name}s, %{name}l")
    e(f"  %{name} = sitofp {I16} %{name}i to {F16}")


def _splat(v: int) -> str:
    return "<" + ", ".join(f"i32 {v}" for _ in range(16)) + ">"


def _float_steps(e: Emit, s: str, mins: bool, tag: str) -> None:
    """Super-block `s`'s float steps into the 32 activation rows' sums, from its %buf half."""
    e(f"  %fpar{tag} = and i64 {s}, 1")
    e(f"  %fhalf{tag} = shl i64 %fpar{tag}, 13")
    e(f"  %fb{tag} = getelementptr i8, ptr %buf, i64 %fhalf{tag}")
    e(f"  %ds{tag} = shl i64 {s}, 6")
    e(f"  %sdp{tag} = getelementptr i8, ptr %drow, i64 %ds{tag}")
    e(f"  %sdv{tag} = load {F16}, ptr %sdp{tag}, align 4")
    if mins:
        e(f"  %smp{tag} = getelementptr i8, ptr %mrow, i64 %ds{tag}")
        e(f"  %smv{tag} = load {F16}, ptr %smp{tag}, align 4")
    for u in range(2 * TILE_ROWS):
        i, row = divmod(u, TILE_ROWS)
        n = f"{u}{tag}"
        load_scalar(e, f"ssv{n}", "srow", "sstride", u, s)
        _split_sum(e, f"is{n}", f"%fb{tag}", 1024 * (2 * i) + 64 * row, 1024 * (2 * i + 1) + 64 * row)
        e(f"  %ssc{n} = fmul {F16} %sdv{tag}, %ssv{n}")
        e(f"  %sap{n} = getelementptr i8, ptr %accs, i64 {64 * u}")
        e(f"  %sacc{n} = load {F16}, ptr %sap{n}, align 64")
        e(f"  %sa{n} = {FMA}({F16} %is{n}, {F16} %ssc{n}, {F16} %sacc{n})")
        result = f"%sa{n}"
        if mins:
            _split_sum(e, f"ms{n}", f"%fb{tag}", 1024 * (4 + 2 * i) + 64 * row, 1024 * (5 + 2 * i) + 64 * row)
            e(f"  %msc{n} = fmul {F16} %smv{tag}, %ssv{n}")
            e(f"  %sm{n} = {FMA}({F16} %ms{n}, {F16} %msc{n}, {F16} %sa{n})")
            result = f"%sm{n}"
        e(f"  store {F16} {result}, ptr %sap{n}, align 64")


def _store(e: Emit) -> None:
    """The step's out rows below t1 (16 weight rows from %r)."""
    e("  %left = sub i64 %t1, %t")
    for u in range(2 * TILE_ROWS):
        e(f"  %ok{u} = icmp ult i64 {u}, %left")
        e(f"  %mk{u}i = insertelement <16 x i1> poison, i1 %ok{u}, i32 0")
        e(f"  %mk{u} = shufflevector <16 x i1> %mk{u}i, <16 x i1> poison, <16 x i32> zeroinitializer")
        e(f"  %ot{u} = add i64 %t, {u}")
        e(f"  %oo{u} = mul i64 %ot{u}, %ostride")
        e(f"  %oi{u} = add i64 %oo{u}, %r")
        e(f"  %op{u} = getelementptr float, ptr %outp, i64 %oi{u}")
        e(f"  %fp{u} = getelementptr i8, ptr %accs, i64 {64 * u}")
        e(f"  %fv{u} = load {F16}, ptr %fp{u}, align 64")
        e(f"  call void @llvm.masked.store.v16f32.p0({F16} %fv{u}, ptr %op{u}, i32 4, <16 x i1> %mk{u})")
