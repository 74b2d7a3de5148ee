"""u5 (Q5_0) and k4 (Q4_K) prefill as outer products: 8 weight rows per vector.

The row kernels (ir_blocks.py, ir_super.py) sum dot products along a
row: each int32 lane holds part of one (weight row, activation row) pair, and the weights
are unpacked again for every tile of 4 activation rows. Here int32 lane r of a vector is
weight row r of a group of 8 (as in llama.cpp's repacked layouts): a step multiplies 4
columns of 8 rows by 4 activations broadcast to every lane, a vector's 8 sums are 8 rows'
outputs, and no horizontal sum is needed. The weights are unpacked once per task into a
scratch (ir_convert.py), which the product then reads for every tile.

Scratch (per group of 8 rows, per 32-column block, OUTER_BLOCK_BYTES[kind] bytes): 8 code
vectors of 32 bytes (byte 4i + c of vector k: row i, column c of the block's k-step k),
then the 8 rows' block scales as f32 (u5: the f16 d; k4: d times the 6-bit scale), then
(k4) the 8 rows' -dmin times the block's min. The k-steps follow the activation order of
the row kernels, so the activations and their S, N and C are theirs:

- u5: block b of its group g of 128 columns (4 blocks); k-step 2v + h reads the 4
  activations at 128g + 32v + 8b + 4h; the integer sums start at C's two lanes of the
  block (-16 times its activations: the codes are unsigned), d_a = S[t, 16g + 2b].
- k4: block b of its super-block g of 256 columns; k-step 2j + h reads 256g + 64j + 32h +
  4b; d_a = S[t, 32g] (per 256); the mins add (-dmin * min) * N[t, 8g + b] (d_a times the
  block's activation codes' sum).

Per block and (row group, activation row): 8 vpdpbusd, then acc += float(isum) * (d_w *
d_a) (and k4's fma of the mins): the float work is once per 8 vpdpbusd. The integer sums
are the row kernels' (exact); the float sums run over the blocks in order, so a result
differs from the row kernels' by f32 rounding only.

The product kernel has ir.Int8Args: out[t, r] for t in [t0, t1) (t1 - t0 a multiple
of its tile) and r in [r0, r1), 16 rows a pass, from a scratch at W (the row group of row
r at W + (r - r0) * wstride, wstride = nb * OUTER_BLOCK_BYTES / 8, nb = 2 * nsteps).
products._run uses it for tasks of OUTER_MIN_ROWS activation rows or more.
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8.ir_dot import dot
from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, broadcast
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

OUTER_KINDS = ("u5", "k4", "u6")
OUTER_BLOCK_COLUMNS = {"u5": 32, "k4": 32, "u6": 256}  # the columns of a block of the product's loop
OUTER_BLOCK_BYTES = {"u5": 256 + 32, "k4": 256 + 64, "u6": 2048 + 512 + 32}  # scratch per row group and block
GROUPS = 2  # row groups of 8 per pass of the product
# activation rows of a task from which products._run converts (16 rows' conversion costs about a product by a few)
OUTER_MIN_ROWS = 32

_F8 = "<8 x float>"
_I8 = "<8 x i32>"


def scratch_bytes_per_row_step(kind: str) -> int:
    """Scratch bytes per weight row and 64-column step: the product's wstride / nsteps."""
    return OUTER_BLOCK_BYTES[kind] * 64 // OUTER_BLOCK_COLUMNS[kind] // 8


def _block_position(e: Emit, kind: str) -> None:
    """Of block %b: %sl (S's lane of its d_a; u5: also C's first lane of the block), %ab (its
    first activation), as i64 (lanes in 4-byte units); k4's N index is %b itself."""
    if kind == "u5":  # 4 blocks per group of 128; S and C: 16 lanes per group, the block's 2b, 2b + 1
        e("  %g = lshr i64 %b, 2")
        e("  %bw = and i64 %b, 3")
        e("  %sl0 = shl i64 %g, 4")
        e("  %bw2 = shl i64 %bw, 1")
        e("  %sl = add i64 %sl0, %bw2")
        e("  %ag = shl i64 %g, 7")
        e("  %abw = shl i64 %bw, 3")
    else:  # 8 blocks per super-block of 256; S: 32 lanes per super-block, all its d_a
        e("  %g = lshr i64 %b, 3")
        e("  %bw = and i64 %b, 7")
        e("  %sl = shl i64 %g, 5")
        e("  %ag = shl i64 %g, 8")
        e("  %abw = shl i64 %bw, 2")
    e("  %ab = add i64 %ag, %abw")


def _step_offset(kind: str, k: int) -> int:
    """The activation offset of k-step k from the block's first activation."""
    hi, h = divmod(k, 2)
    return 32 * hi + 4 * h if kind == "u5" else 64 * hi + 32 * h


def _block_sums(e: Emit, kind: str, tile: int, pairs: list[tuple[int, int]], isa: str) -> dict[tuple[int, int], str]:
    """A u5 or k4 block (32 columns, at %wb{gi}): per pair its int32 sums over 8 k-steps."""
    _block_position(e, kind)
    sums = {p: "zeroinitializer" for p in pairs}
    if kind == "u5":  # the codes' offset: C's two lanes of the block
        for t in range(tile):
            e(f"  %cp{t} = getelementptr i32, ptr %crow{t}, i64 %sl")
            e(f"  %c{t}v = load <2 x i32>, ptr %cp{t}, align 4")
            e(f"  %c{t}a = extractelement <2 x i32> %c{t}v, i32 0")
            e(f"  %c{t}b = extractelement <2 x i32> %c{t}v, i32 1")
            e(f"  %c{t} = add i32 %c{t}a, %c{t}b")
            broadcast(e, f"off{t}", _I8, "i32", f"%c{t}")
        sums = {p: f"%off{p[1]}" for p in pairs}
    for k in range(8):
        _k_step(e, isa, tile, sums, k, str(32 * k), _step_offset(kind, k))
    return sums


def _k_step(
    e: Emit, isa: str, tile: int, sums: dict[tuple[int, int], str], k: int, weights: str, activations: int
) -> None:
    """k-step k: row group gi's code vector at %wb{gi} + `weights` (an i64 constant or
    value), activation row t's 4 activations at %arow{t} + %ab + `activations` broadcast
    to every lane, and one dot per pair onto `sums` (updated: pair -> its IR value)."""
    for gi in range(GROUPS):
        e(f"  %wp{gi}_{k} = getelementptr i8, ptr %wb{gi}, i64 {weights}")
        e(f"  %w{gi}_{k} = load {_I8}, ptr %wp{gi}_{k}, align 1")
    for t in range(tile):
        e(f"  %ao{t}_{k} = add i64 %ab, {activations}")
        e(f"  %ap{t}_{k} = getelementptr i8, ptr %arow{t}, i64 %ao{t}_{k}")
        e(f"  %a{t}_{k}s = load i32, ptr %ap{t}_{k}, align 1")
        broadcast(e, f"a{t}_{k}", _I8, "i32", f"%a{t}_{k}s")
        for gi in range(GROUPS):
            dot(e, isa, f"q{gi}_{t}_{k}", sums[(gi, t)], f"%w{gi}_{k}", f"%a{t}_{k}")
            sums[(gi, t)] = f"%q{gi}_{t}_{k}"


def _u6_sums(e: Emit, tile: int, pairs: list[tuple[int, int]], isa: str) -> dict[tuple[int, int], str]:
    """A u6 super-block (at %wb{gi}), by a loop over its 16 sub-blocks of 16 columns (blocks
    mloop, then mdone): per pair, the sum over sub-blocks of each sub-block's integer sum
    (from the codes' offset, -32 times its activations, C's 4 int16 lanes) times its rows'
    int8 scales (vpmulld): |.| < 2^28."""
    e("  br label %mloop")
    e("mloop:")
    e("  %m = phi i64 [ 0, %bloop ], [ %mn, %mloop ]")
    for gi, t in pairs:
        e(f"  %it{gi}_{t} = phi {_I8} [ zeroinitializer, %bloop ], [ %itn{gi}_{t}, %mloop ]")
    e("  %mq = lshr i64 %m, 2")
    e("  %mr = and i64 %m, 3")
    e("  %bs = shl i64 %b, 2")
    e("  %s = add i64 %bs, %mq")  # the sub-block's step of 64 columns, and its 16-group %mr there
    e("  %as = shl i64 %s, 6")
    e("  %amr = shl i64 %mr, 3")
    e("  %ab = add i64 %as, %amr")
    e("  %cs = shl i64 %s, 4")
    e("  %cmr = shl i64 %mr, 2")
    e("  %cl = add i64 %cs, %cmr")
    e("  %mo = shl i64 %m, 7")
    for t in range(tile):
        e(f"  %cp{t} = getelementptr i16, ptr %crow{t}, i64 %cl")
        e(f"  %c{t}h = load <4 x i16>, ptr %cp{t}, align 2")
        e(f"  %c{t}w = sext <4 x i16> %c{t}h to <4 x i32>")
        for n in range(4):
            e(f"  %c{t}e{n} = extractelement <4 x i32> %c{t}w, i32 {n}")
        e(f"  %c{t}s0 = add i32 %c{t}e0, %c{t}e1")
        e(f"  %c{t}s1 = add i32 %c{t}e2, %c{t}e3")
        e(f"  %c{t}s = add i32 %c{t}s0, %c{t}s1")
        e(f"  %c{t} = sub i32 0, %c{t}s")
        broadcast(e, f"off{t}", _I8, "i32", f"%c{t}")
    sums = {p: f"%off{p[1]}" for p in pairs}
    for k in range(4):  # k-step 2h + e: the sub-block's code vector k, the activations at 32h + 4e
        h, step = divmod(k, 2)
        e(f"  %wq{k} = add i64 %mo, {32 * k}")
        _k_step(e, isa, tile, sums, k, f"%wq{k}", 32 * h + 4 * step)
    e("  %sco = shl i64 %m, 5")
    e("  %scq = add i64 %sco, 2048")
    for gi in range(GROUPS):
        e(f"  %scp{gi} = getelementptr i8, ptr %wb{gi}, i64 %scq")
        e(f"  %scv{gi} = load {_I8}, ptr %scp{gi}, align 1")
    for gi, t in pairs:
        e(f"  %sm{gi}_{t} = mul {_I8} {sums[(gi, t)]}, %scv{gi}")
        e(f"  %itn{gi}_{t} = add {_I8} %it{gi}_{t}, %sm{gi}_{t}")
    e("  %mn = add i64 %m, 1")
    e("  %mmore = icmp ult i64 %mn, 16")
    e("  br i1 %mmore, label %mloop, label %mdone")
    e("mdone:")
    return {(gi, t): f"%itn{gi}_{t}" for gi, t in pairs}


def product_ir(kind: str, name: str, signature: KernelSignature, tile: int, isa: str) -> str:
    """IR of the outer product kernel `name` of `kind` for `tile` activation rows (the module
    docstring's contract)."""
    pairs = [(gi, t) for gi in range(GROUPS) for t in range(tile)]
    lines: list[str] = []
    e = lines.append
    frame.entry(e, signature, name, 0)  # the pointers; it branches to %rloop
    e("rloop:")  # over passes of GROUPS row groups
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    e(f"  %nb = {'lshr i64 %nsteps, 2' if kind == 'u6' else 'shl i64 %nsteps, 1'}")  # blocks per row
    e("  %rel = sub i64 %r, %r0")
    e("  %wo = mul i64 %rel, %wstride")
    for gi in range(GROUPS):
        e(f"  %wg{gi}x = mul i64 %wstride, {gi * 8}")
        e(f"  %wg{gi}y = add i64 %wo, %wg{gi}x")
        e(f"  %wrow{gi} = getelementptr i8, ptr %Wp, i64 %wg{gi}y")
    e("  br label %tloop")
    e("tloop:")  # over tiles of activation rows, t0 to t1
    e("  %tt = phi i64 [ %t0, %rloop ], [ %ttn, %tlatch ]")
    for t in range(tile):
        e(f"  %trow{t} = add i64 %tt, {t}")
        rows_of = (("a", "Ap", "astride"), ("s", "Sp", "sstride"), ("c", "Cp", "cstride"), ("n", "Np", "nstride"))
        for v, base, stride in rows_of:
            e(f"  %{v}off{t} = mul i64 %trow{t}, %{stride}")
            e(f"  %{v}row{t} = getelementptr i8, ptr %{base}, i64 %{v}off{t}")
        e(f"  %ooff{t} = mul i64 %trow{t}, %ostride")
    e("  br label %bloop")
    latch = "mdone" if kind == "u6" else "bloop"  # the block that closes a block's iteration
    e("bloop:")  # over blocks (u5, k4: 32 columns; u6: a super-block of 256)
    e("  %b = phi i64 [ 0, %tloop ], [ %bn, %" + latch + " ]")
    for gi, t in pairs:
        e(f"  %acc{gi}_{t} = phi {_F8} [ zeroinitializer, %tloop ], [ %accn{gi}_{t}, %{latch} ]")
    e(f"  %bo = mul i64 %b, {OUTER_BLOCK_BYTES[kind]}")
    for gi in range(GROUPS):
        e(f"  %wb{gi} = getelementptr i8, ptr %wrow{gi}, i64 %bo")
    sums = _u6_sums(e, tile, pairs, isa) if kind == "u6" else _block_sums(e, kind, tile, pairs, isa)
    for gi in range(GROUPS):
        e(f"  %dwp{gi} = getelementptr i8, ptr %wb{gi}, i64 {OUTER_BLOCK_BYTES[kind] - (64 if kind == 'k4' else 32)}")
        e(f"  %dw{gi} = load {_F8}, ptr %dwp{gi}, align 1")
        if kind == "k4":  # -dmin * min of the block
            e(f"  %mwp{gi} = getelementptr i8, ptr %wb{gi}, i64 288")
            e(f"  %mw{gi} = load {_F8}, ptr %mwp{gi}, align 1")
    if kind == "u6":
        e("  %sl = shl i64 %b, 5")  # S: 32 lanes per 256 columns
    for t in range(tile):
        e(f"  %sp{t} = getelementptr float, ptr %srow{t}, i64 %sl")
        e(f"  %sa{t} = load float, ptr %sp{t}, align 4")
        broadcast(e, f"sc{t}", _F8, "float", f"%sa{t}")
        if kind == "k4":
            e(f"  %np{t} = getelementptr float, ptr %nrow{t}, i64 %b")
            e(f"  %na{t} = load float, ptr %np{t}, align 4")
            broadcast(e, f"nv{t}", _F8, "float", f"%na{t}")
    for gi, t in pairs:
        k = f"{gi}_{t}"
        e(f"  %f{k} = sitofp {_I8} {sums[(gi, t)]} to {_F8}")
        e(f"  %ds{k} = fmul {_F8} %dw{gi}, %sc{t}")
        last = "acs" if kind == "k4" else "accn"
        e(f"  %{last}{k} = call {_F8} @llvm.fma.v8f32({_F8} %f{k}, {_F8} %ds{k}, {_F8} %acc{k})")
        if kind == "k4":
            e(f"  %accn{k} = call {_F8} @llvm.fma.v8f32({_F8} %mw{gi}, {_F8} %nv{t}, {_F8} %acs{k})")
    e("  %bn = add i64 %b, 1")
    e("  %bmore = icmp ult i64 %bn, %nb")
    e("  br i1 %bmore, label %bloop, label %tlatch")
    e("tlatch:")
    for gi, t in pairs:
        k = f"{gi}_{t}"
        e(f"  %oc{k} = add i64 %r, {8 * gi}")
        e(f"  %oi{k} = add i64 %ooff{t}, %oc{k}")
        e(f"  %op{k} = getelementptr float, ptr %outp, i64 %oi{k}")
        e(f"  store {_F8} %accn{k}, ptr %op{k}, align 4")
    e(f"  %ttn = add i64 %tt, {tile}")
    e("  %tmore = icmp ult i64 %ttn, %t1")
    e("  br i1 %tmore, label %tloop, label %rlatch")
    e("rlatch:")
    e(f"  %rn = add i64 %r, {8 * GROUPS}")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %rloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(lines)
