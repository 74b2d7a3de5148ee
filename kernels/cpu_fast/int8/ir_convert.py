"""The convert kernels of the outer products (ir_outer.py): weight rows of a u5,
k4 or u6 matrix into the outer products' scratch, 8 rows at a time.

Contract (ir.Int8Args): rows [r0, r1) (r1 - r0 a multiple of 8) of the matrix at W, D
(wstride, dstride, nsteps as the row kernels read them) into the scratch at `out`, row
group (r - r0) / 8 at (r - r0) / 8 * nb * OUTER_BLOCK_BYTES, in ir_outer's layout.
Per row group and 64-column step each row's codes are unpacked as the row kernels unpack
them (u5: nibbles and bit 4; k4: nibbles; u6: nibbles and bits 4-5), into two vectors of 8
words (one word: 4 codes of one block and k-step); an 8 x 8 transpose of those words makes
each word index a vector of 8 rows. The scales become vectors of 8 rows the same way, in the
form ir_outer's float order needs: u5's d and u6's d as f32; the integer scales (k4's 6-bit
scales, u6's int8 ones) as int32 for vpmulld, k4's 6-bit mins as int16 pairs for vpmaddwd,
k4's d and -dmin as f32 (so the product multiplies d by d_a once per super-block).
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8.ir_outer import K4_D, K4_MINS, K4_NDMIN, K4_SCALES, OUTER_BLOCK_BYTES
from zinfer.kernels.cpu_fast.int8.ir_scales import (
    K4_SUPER_BYTES,
    U6_SUPER_BYTES,
    Emit,
    bit4s,
    high_pairs,
    shuffle_mask,
    splat,
)
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

STEP_BYTES = {"u5": 40, "k4": 32, "u6": 48}  # the row layouts' bytes per 64-column step and row
U6_SUB_BYTES = 128  # a u6 sub-block of 16 columns in the scratch: 4 k-steps of 32 bytes

_F8 = "<8 x float>"
_I8 = "<8 x i32>"
_B32 = "<32 x i8>"


# an 8 x 8 transpose of 32-bit words in three rounds of two-source shuffles
_PAIR_LO, _PAIR_HI = shuffle_mask((0, 8, 1, 9, 4, 12, 5, 13)), shuffle_mask((2, 10, 3, 11, 6, 14, 7, 15))
_QUAD_LO, _QUAD_HI = shuffle_mask((0, 1, 8, 9, 4, 5, 12, 13)), shuffle_mask((2, 3, 10, 11, 6, 7, 14, 15))
_HALF_LO, _HALF_HI = shuffle_mask((0, 1, 2, 3, 8, 9, 10, 11)), shuffle_mask((4, 5, 6, 7, 12, 13, 14, 15))


def transpose8(e: Emit, name: str, rows: list[str]) -> list[str]:
    """%{name}{q} (q < 8) = <8 x i32>: word q of each of the 8 `rows` (<8 x i32>), row i in lane i."""
    for p in range(4):
        a, b = rows[2 * p], rows[2 * p + 1]
        e(f"  %{name}t{2 * p} = shufflevector {_I8} {a}, {_I8} {b}, <8 x i32> {_PAIR_LO}")
        e(f"  %{name}t{2 * p + 1} = shufflevector {_I8} {a}, {_I8} {b}, <8 x i32> {_PAIR_HI}")
    for half in range(2):  # rows 0-3, then 4-7
        t = 4 * half
        quads = ((t, t + 2, _QUAD_LO), (t, t + 2, _QUAD_HI), (t + 1, t + 3, _QUAD_LO), (t + 1, t + 3, _QUAD_HI))
        for k, (x, y, m) in enumerate(quads):
            e(f"  %{name}u{t + k} = shufflevector {_I8} %{name}t{x}, {_I8} %{name}t{y}, <8 x i32> {m}")
    for q in range(4):  # word q of every row, and word q + 4
        e(f"  %{name}{q} = shufflevector {_I8} %{name}u{q}, {_I8} %{name}u{q + 4}, <8 x i32> {_HALF_LO}")
        e(f"  %{name}{q + 4} = shufflevector {_I8} %{name}u{q}, {_I8} %{name}u{q + 4}, <8 x i32> {_HALF_HI}")
    return [f"%{name}{q}" for q in range(8)]


def _store(e: Emit, name: str, value: str, ty: str, offset: str) -> None:
    e(f"  %{name}p = getelementptr i8, ptr %dst, i64 {offset}")
    e(f"  store {ty} {value}, ptr %{name}p, align 1")


def _store_transposed(e: Emit, name: str, rows: list[str], base: str, offsets: list[int]) -> None:
    """The 8 words of transpose8(rows), word q at %dst + `base` + offsets[q]."""
    for q, word in enumerate(transpose8(e, name, rows)):
        e(f"  %{name}o{q} = add i64 {base}, {offsets[q]}")
        _store(e, f"{name}s{q}", word, _I8, f"%{name}o{q}")


def _open(e: Emit, signature: KernelSignature, name: str, kind: str) -> None:
    """Entry, the loop over row groups (%r, its rows' %wrow{i} and %drow{i}, %dst), then block `sloop`."""
    frame.entry(e, signature, name, 0)  # it branches to %rloop
    e("rloop:")
    e(f"  %nb = {'shl i64 %nsteps, 1' if kind == 'u5' else 'lshr i64 %nsteps, 2'}")  # blocks per row (k4, u6: of 256)
    e(f"  %groupbytes = mul i64 %nb, {OUTER_BLOCK_BYTES[kind]}")
    e("  br label %gloop")
    e("gloop:")  # over row groups of 8
    e("  %r = phi i64 [ %r0, %rloop ], [ %rn, %gdone ]")
    e("  %rel = sub i64 %r, %r0")
    e("  %gi = lshr i64 %rel, 3")
    e("  %dsto = mul i64 %gi, %groupbytes")
    e("  %dst = getelementptr i8, ptr %outp, i64 %dsto")
    for i in range(8):
        e(f"  %row{i} = add i64 %r, {i}")
        e(f"  %woff{i} = mul i64 %row{i}, %wstride")
        e(f"  %wrow{i} = getelementptr i8, ptr %Wp, i64 %woff{i}")
        e(f"  %doff{i} = mul i64 %row{i}, %dstride")
        e(f"  %drow{i} = getelementptr i8, ptr %Dp, i64 %doff{i}")
    e("  br label %sloop")
    e("sloop:")  # over steps of 64 columns
    e("  %s = phi i64 [ 0, %gloop ], [ %sn, %sloop ]")


def _close(e: Emit) -> None:
    """The end of the row-group loop (block gdone) and of the kernel."""
    e("  br label %gdone")
    e("gdone:")
    e("  %rn = add i64 %r, 8")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %gloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")


def _code_words(e: Emit, kind: str) -> None:
    """Per row i of the group, at step %s: %lo{i} and %hi{i} <8 x i32>, its step's two code vectors."""
    e(f"  %wo = mul i64 %s, {STEP_BYTES[kind]}")
    for i in range(8):
        e(f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %wo")
        e(f"  %w{i} = load {_B32}, ptr %wp{i}, align 1")
        e(f"  %l4{i} = and {_B32} %w{i}, {splat(32, 'i8', 15)}")
        e(f"  %h4{i} = lshr {_B32} %w{i}, {splat(32, 'i8', 4)}")
        if kind in ("u5", "u6"):  # u5: bit 4 of both vectors' codes, 8 bytes after the nibbles; u6: bits 4-5, 16 bytes
            (bit4s if kind == "u5" else high_pairs)(e, f"lb{i}", f"hb{i}", f"%wp{i}", 32)
            e(f"  %l5{i} = or {_B32} %l4{i}, %lb{i}")
            e(f"  %h5{i} = or {_B32} %h4{i}, %hb{i}")
            low, high = f"%l5{i}", f"%h5{i}"
        else:
            low, high = f"%l4{i}", f"%h4{i}"
        e(f"  %lo{i} = bitcast {_B32} {low} to {_I8}")
        e(f"  %hi{i} = bitcast {_B32} {high} to {_I8}")


def convert_ir(kind: str, name: str, signature: KernelSignature) -> str:
    """IR of the convert kernel `name` of `kind` ("u5", "k4" or "u6"): the module docstring's contract."""
    size = OUTER_BLOCK_BYTES[kind]
    lines: list[str] = []
    e = lines.append
    _open(e, signature, name, kind)
    _code_words(e, kind)
    if kind == "u5":  # word q of step s: block 4 (s / 2) + q / 2 (class q / 2), k-step 2 (2 (s % 2) + h) + q % 2
        e("  %g = lshr i64 %s, 1")
        e("  %odd = and i64 %s, 1")
        e(f"  %gb = mul i64 %g, {size}")
        e("  %vo = shl i64 %odd, 7")
        e("  %base = add i64 %gb, %vo")
        e(f"  %clsbytes = mul i64 %nb, {size // 4}")  # a class's nb / 4 blocks
        for c in range(4):
            e(f"  %cb{c}x = mul i64 %clsbytes, {c}")
            e(f"  %cb{c} = add i64 %base, %cb{c}x")
        for h, v in enumerate(("lo", "hi")):
            for q, word in enumerate(transpose8(e, f"x{v}", [f"%{v}{i}" for i in range(8)])):
                e(f"  %x{v}o{q} = add i64 %cb{q // 2}, {64 * h + 32 * (q % 2)}")
                _store(e, f"x{v}s{q}", word, _I8, f"%x{v}o{q}")
        place: list[int] = []
    elif kind == "u6":  # word q of step s: super-block s / 4, sub-block 4 (s % 4) + q / 2, k-step 2h + q % 2
        e("  %g = lshr i64 %s, 2")
        e("  %j = and i64 %s, 3")
        e(f"  %gb = mul i64 %g, {size}")
        e(f"  %jo = shl i64 %j, {(4 * U6_SUB_BYTES).bit_length() - 1}")
        e("  %base = add i64 %gb, %jo")
        place = [((q // 2) * U6_SUB_BYTES + 32 * (2 * h + q % 2)) for h in range(2) for q in range(8)]
    else:  # word b of step s: super-block s / 4, its block b, k-step 2 (s % 4) + h
        e("  %g = lshr i64 %s, 2")
        e("  %j = and i64 %s, 3")
        e(f"  %gb = mul i64 %g, {size}")
        e("  %jo = shl i64 %j, 6")
        e("  %base = add i64 %gb, %jo")
        place = [(b * 256 + 32 * h) for h in range(2) for b in range(8)]
    if kind != "u5":
        for h, v in enumerate(("lo", "hi")):
            _store_transposed(e, f"x{v}", [f"%{v}{i}" for i in range(8)], "%base", place[8 * h : 8 * h + 8])
    e("  %sn = add i64 %s, 1")
    e("  %smore = icmp ult i64 %sn, %nsteps")
    e("  br i1 %smore, label %sloop, label %scales")
    e("scales:")
    {"u5": _u5_scales, "k4": _k4_scales, "u6": _u6_scales}[kind](e, size)
    _close(e)
    return "\n".join(lines)


def _u5_scales(e: Emit, size: int) -> None:
    """Each block's 8 f16 scales (one per row) as f32 after its codes (blocks in class order)."""
    e("  br label %bloop")
    e("bloop:")
    e("  %b = phi i64 [ 0, %scales ], [ %bn, %bloop ]")
    e("  %bo = shl i64 %b, 1")
    e("  %d0 = insertelement <8 x half> poison, half 0.0, i32 0")
    for i in range(8):
        e(f"  %dp{i} = getelementptr i8, ptr %drow{i}, i64 %bo")
        e(f"  %dh{i} = load half, ptr %dp{i}, align 2")
        e(f"  %d{i + 1} = insertelement <8 x half> %d{i}, half %dh{i}, i32 {i}")
    e(f"  %df = fpext <8 x half> %d8 to {_F8}")
    e("  %bg = lshr i64 %b, 2")  # block b at class b % 4's blocks, position b / 4 there
    e("  %bc = and i64 %b, 3")
    e("  %nq = lshr i64 %nb, 2")
    e("  %bcq = mul i64 %bc, %nq")
    e("  %bpos = add i64 %bcq, %bg")
    e(f"  %dso = mul i64 %bpos, {size}")
    e("  %dso2 = add i64 %dso, 256")
    _store(e, "ds", "%df", _F8, "%dso2")
    e("  %bn = add i64 %b, 1")
    e("  %bmore = icmp ult i64 %bn, %nb")
    e("  br i1 %bmore, label %bloop, label %bexit")
    e("bexit:")


def _k4_scales(e: Emit, size: int) -> None:
    """Per super-block, after its codes: its 8 blocks' 6-bit scales as int32 x 8 rows (one
    vector per block, at K4_SCALES + 32 j), its mins as int16 pairs x 8 rows (vector q: lane
    i holds row i's mins 2q, 2q + 1; at K4_MINS + 32 q), then the 8 rows' d and -dmin as f32."""
    e("  %nsup = lshr i64 %nsteps, 2")
    e("  br label %kloop")
    e("kloop:")
    e("  %k = phi i64 [ 0, %scales ], [ %kn, %kloop ]")
    e(f"  %sup = mul i64 %k, {K4_SUPER_BYTES}")
    e("  %d0 = insertelement <8 x half> poison, half 0.0, i32 0")
    e("  %n0 = insertelement <8 x half> poison, half 0.0, i32 0")
    for i in range(8):
        e(f"  %sp{i} = getelementptr i8, ptr %drow{i}, i64 %sup")
        e(f"  %dh{i} = load half, ptr %sp{i}, align 1")
        e(f"  %d{i + 1} = insertelement <8 x half> %d{i}, half %dh{i}, i32 {i}")
        e(f"  %np{i} = getelementptr i8, ptr %sp{i}, i64 2")
        e(f"  %nh{i} = load half, ptr %np{i}, align 1")
        e(f"  %n{i + 1} = insertelement <8 x half> %n{i}, half %nh{i}, i32 {i}")
        e(f"  %qp{i} = getelementptr i8, ptr %sp{i}, i64 4")
        e(f"  %q{i} = load <8 x i8>, ptr %qp{i}, align 1")
        e(f"  %qi{i} = zext <8 x i8> %q{i} to {_I8}")
        e(f"  %mp{i} = getelementptr i8, ptr %sp{i}, i64 12")
        e(f"  %m{i} = load <8 x i8>, ptr %mp{i}, align 1")
        e(f"  %mh{i} = zext <8 x i8> %m{i} to <8 x i16>")
        e(f"  %mw{i} = bitcast <8 x i16> %mh{i} to <4 x i32>")
        e(f"  %mi{i} = shufflevector <4 x i32> %mw{i}, <4 x i32> zeroinitializer, <8 x i32> {shuffle_mask(range(8))}")
    e(f"  %kb = mul i64 %k, {size}")
    _store_transposed(e, "ysc", [f"%qi{i}" for i in range(8)], "%kb", [K4_SCALES + 32 * j for j in range(8)])
    for q, word in enumerate(transpose8(e, "ymn", [f"%mi{i}" for i in range(8)])[:4]):
        e(f"  %ymno{q} = add i64 %kb, {K4_MINS + 32 * q}")
        _store(e, f"ymns{q}", word, _I8, f"%ymno{q}")
    e(f"  %df = fpext <8 x half> %d8 to {_F8}")
    e(f"  %nf = fpext <8 x half> %n8 to {_F8}")
    e(f"  %nd = fneg {_F8} %nf")
    e(f"  %od = add i64 %kb, {K4_D}")
    _store(e, "kd", "%df", _F8, "%od")
    e(f"  %on = add i64 %kb, {K4_NDMIN}")
    _store(e, "kn", "%nd", _F8, "%on")
    e("  %kn = add i64 %k, 1")
    e("  %kmore = icmp ult i64 %kn, %nsup")
    e("  br i1 %kmore, label %kloop, label %kexit")
    e("kexit:")


def _u6_scales(e: Emit, size: int) -> None:
    """Per super-block, each sub-block's 8 rows' int8 scales as int32 (after the 16
    sub-blocks' codes, at 2048 + 32 m), then the 8 rows' f16 d as f32 (at 2560)."""
    e("  %nsup = lshr i64 %nsteps, 2")
    e("  br label %kloop")
    e("kloop:")
    e("  %k = phi i64 [ 0, %scales ], [ %kn, %kloop ]")
    e(f"  %sup = mul i64 %k, {U6_SUPER_BYTES}")
    e("  %d0 = insertelement <8 x half> poison, half 0.0, i32 0")
    for i in range(8):
        e(f"  %sp{i} = getelementptr i8, ptr %drow{i}, i64 %sup")
        e(f"  %dh{i} = load half, ptr %sp{i}, align 1")
        e(f"  %d{i + 1} = insertelement <8 x half> %d{i}, half %dh{i}, i32 {i}")
        e(f"  %qp{i} = getelementptr i8, ptr %sp{i}, i64 2")
        e(f"  %q{i} = load <16 x i8>, ptr %qp{i}, align 1")
        e(f"  %qs{i} = sext <16 x i8> %q{i} to <16 x i32>")
        for half in range(2):
            lanes = ", ".join(f"i32 {8 * half + n}" for n in range(8))
            e(f"  %qh{half}_{i} = shufflevector <16 x i32> %qs{i}, <16 x i32> poison, <8 x i32> <{lanes}>")
    e(f"  %kb = mul i64 %k, {size}")
    for half in range(2):
        offsets = [2048 + 32 * (8 * half + m) for m in range(8)]
        _store_transposed(e, f"ys{half}", [f"%qh{half}_{i}" for i in range(8)], "%kb", offsets)
    e(f"  %df = fpext <8 x half> %d8 to {_F8}")
    e("  %od = add i64 %kb, 2560")
    _store(e, "sd", "%df", _F8, "%od")
    e("  %kn = add i64 %k, 1")
    e("  %kmore = icmp ult i64 %kn, %nsup")
    e("  br i1 %kmore, label %kloop, label %kexit")
    e("kexit:")
