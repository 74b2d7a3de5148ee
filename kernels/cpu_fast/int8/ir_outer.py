"""u5 (Q5_0), k4 (Q4_K) and u6 (Q6_K) prefill as outer products: 8 weight rows per vector.

The row kernels (ir_blocks.py, ir_super.py) sum dot products along a
row: each int32 lane holds part of one (weight row, activation row) pair, and the weights
are unpacked again for every tile of 4 activation rows. Here int32 lane r of a vector is
weight row r of a group of 8 (as in llama.cpp's repacked layouts): a step multiplies 4
columns of 8 rows by 4 activations broadcast to every lane, a vector's 8 sums are 8 rows'
outputs, and no horizontal sum is needed. The weights are unpacked once per task into a
scratch (ir_convert.py), which the product then reads for every tile.

Float order: the one of every int8 path (tests/int8_canonical.py is its spec and numpy
reference; these kernels equal it bit for bit). The integers are exact; per output:
- u5: block b (32 columns, in column order) into class b % 4: acc[b % 4] =
  fma(f32(I_b), d_b * d_a, acc[b % 4]); out = ((acc0 + acc1) + acc2) + acc3. The loop runs
  over the classes (blocks c, c + 4, ... of a row), folding each into out left to right.
- k4: per super-block s, I_s = sum_j scale_j * I_j and M_s = sum_j min_j * codesum_j (int32);
  acc = fma(f32(I_s), d_s * d_a, acc), then acc = fma(f32(M_s), -dmin_s * d_a, acc).
- u6: per super-block s, I_s = sum of its 16 sub-blocks' scale_j * I_j; acc =
  fma(f32(I_s), d_s * d_a, acc).

Scratch (per group of 8 rows and block of the loop, OUTER_BLOCK_BYTES[kind] bytes; u5: 32
columns, k4 and u6: 256): code vectors of 32 bytes (byte 4i + c of vector k: row i, column c
of the block's k-step k), then the 8 rows' scales: u5, the f16 d as f32 (a row's blocks in
class order: block 4g + c at position c * nb / 4 + g, so a class's loop reads on); k4 (at K4_*), its 8
blocks' 6-bit scales as int32 (one vector per block), its mins as int16 pairs (vector q,
lane i: row i's mins 2q, 2q + 1), d and -dmin as f32; u6, its 16 sub-blocks' int8 scales as
int32, d as f32. The k-steps follow the activation order of the row kernels, so the
activations and their S and C are theirs:

- u5: block b of its group g of 128 columns (4 blocks); k-step 2v + h reads the 4
  activations at 128g + 32v + 8b + 4h; the integer sums start at C's two lanes of the
  block (-16 times its activations: the codes are unsigned), d_a = S[t, 16g + 2b].
- k4: block j of super-block g; k-step 2k + h reads 256g + 64k + 32h + 4j; d_a = S[t, 32g]
  (per 256); the block sums times the scales by vpmulld, the code sums C[t, 8g + j] times
  the mins by vpmaddwd.
- u6: sub-block m of 16 columns, 4 k-steps, from the codes' offset (-32 times its
  activations, C's int16 lanes), times the scales by vpmulld.

The float work is once per 8 vpdpbusd (u5) or per super-block (k4: 2 fma; u6: 1).

The product kernel has ir.Int8Args: out[t, r] for t in [t0, t1) (t1 - t0 a multiple
of its tile) and r in [r0, r1), 16 rows a pass, from a scratch at W (the row group of row
r at W + (r - r0) * wstride, wstride = nb * OUTER_BLOCK_BYTES / 8, nb the blocks of a row).
row_driver.run_jobs uses it for tasks of OUTER_MIN_ROWS activation rows or more.
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8.ir_dot import dot
from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, broadcast
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

OUTER_KINDS = ("u5", "k4", "u6")
OUTER_BLOCK_COLUMNS = {"u5": 32, "k4": 256, "u6": 256}  # the columns of a block of the product's loop
# scratch per row group and block (k4: codes, int32 scales, int16 min pairs, f32 d, f32 -dmin; K4_* their offsets)
OUTER_BLOCK_BYTES = {"u5": 256 + 32, "k4": 2048 + 256 + 128 + 32 + 32, "u6": 2048 + 512 + 32}
K4_SCALES, K4_MINS, K4_D, K4_NDMIN = 2048, 2048 + 256, 2048 + 256 + 128, 2048 + 256 + 128 + 32
U5_CLASSES = 4  # u5's float sums: block b of a row into class b % 4, the classes summed left to right at the end
GROUPS = 2  # row groups of 8 per pass of the product
# activation rows of a task from which row_driver.run_jobs converts (16 rows' conversion costs about a product by a few)
OUTER_MIN_ROWS = 32

_F8 = "<8 x float>"
_I8 = "<8 x i32>"
_W16 = "<16 x i16>"


def scratch_bytes_per_row_step(kind: str) -> int:
    """Scratch bytes per weight row and 64-column step: the product's wstride / nsteps."""
    return OUTER_BLOCK_BYTES[kind] * 64 // OUTER_BLOCK_COLUMNS[kind] // 8


def _u5_sums(e: Emit, tile: int, pairs: list[tuple[int, int]], isa: str) -> dict[tuple[int, int], str]:
    """u5 block 4 %g + %cls (class %cls of its group %g of 128 columns, at %wb{gi}): per pair
    its int32 sum over 8 k-steps, from the codes' offset (C's two lanes of the block: -16
    times its activations). Defines %sl, S's lane of the block's d_a."""
    e("  %sl0 = shl i64 %g, 4")  # S and C: 16 lanes per group, the block's 2 cls, 2 cls + 1
    e("  %cls2 = shl i64 %cls, 1")
    e("  %sl = add i64 %sl0, %cls2")
    e("  %ag = shl i64 %g, 7")
    e("  %acls = shl i64 %cls, 3")
    e("  %ab = add i64 %ag, %acls")
    for t in range(tile):
        e(f"  %cp{t} = getelementptr i32, ptr %crow{t}, i64 %sl")
        e(f"  %c{t}v = load <2 x i32>, ptr %cp{t}, align 4")
        e(f"  %c{t}a = extractelement <2 x i32> %c{t}v, i32 0")
        e(f"  %c{t}b = extractelement <2 x i32> %c{t}v, i32 1")
        e(f"  %c{t} = add i32 %c{t}a, %c{t}b")
        broadcast(e, f"off{t}", _I8, "i32", f"%c{t}")
    sums = {p: f"%off{p[1]}" for p in pairs}
    for k in range(8):  # k-step 2v + h: the 4 activations at 32v + 4h
        _k_step(e, isa, tile, sums, k, str(32 * k), 32 * (k // 2) + 4 * (k % 2))
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


def _sub_blocks_open(e: Emit, pairs: list[tuple[int, int]]) -> None:
    """The block `mloop` over the sub-blocks %m of super-block %b (entered from `bloop`), with
    each pair's int32 sum so far %it{gi}_{t}."""
    e("  br label %mloop")
    e("mloop:")
    e("  %m = phi i64 [ 0, %bloop ], [ %mn, %mloop ]")
    for gi, t in pairs:
        e(f"  %it{gi}_{t} = phi {_I8} [ zeroinitializer, %bloop ], [ %itn{gi}_{t}, %mloop ]")


def _sub_blocks_close(
    e: Emit, pairs: list[tuple[int, int]], sums: dict[tuple[int, int], str], scales: int, count: int
) -> dict[tuple[int, int], str]:
    """The end of `mloop`: each pair's sub-block sum times its rows' integer scales (int32
    x 8 rows at %wb{gi} + scales + 32 %m, vpmulld) onto %it; `count` sub-blocks, then block
    `mdone`. Per pair the super-block's integer sum, as IR values."""
    e("  %sco = shl i64 %m, 5")
    e(f"  %scq = add i64 %sco, {scales}")
    for gi in range(GROUPS):
        e(f"  %scp{gi} = getelementptr i8, ptr %wb{gi}, i64 %scq")
        e(f"  %scv{gi} = load {_I8}, ptr %scp{gi}, align 1")
    for gi, t in pairs:
        e(f"  %sm{gi}_{t} = mul {_I8} {sums[(gi, t)]}, %scv{gi}")
        e(f"  %itn{gi}_{t} = add {_I8} %it{gi}_{t}, %sm{gi}_{t}")
    e("  %mn = add i64 %m, 1")
    e(f"  %mmore = icmp ult i64 %mn, {count}")
    e("  br i1 %mmore, label %mloop, label %mdone")
    e("mdone:")
    return {(gi, t): f"%itn{gi}_{t}" for gi, t in pairs}


def _u6_sums(e: Emit, tile: int, pairs: list[tuple[int, int]], isa: str) -> dict[tuple[int, int], str]:
    """A u6 super-block (at %wb{gi}), by a loop over its 16 sub-blocks of 16 columns (blocks
    mloop, then mdone): per pair, the sum over sub-blocks of each sub-block's integer sum
    (from the codes' offset, -32 times its activations, C's 4 int16 lanes) times its rows'
    int8 scales (vpmulld): |.| < 2^28."""
    _sub_blocks_open(e, pairs)
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
    return _sub_blocks_close(e, pairs, sums, 2048, 16)


def _k4_sums(
    e: Emit, tile: int, pairs: list[tuple[int, int]], isa: str
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], str]]:
    """A k4 super-block %b (at %wb{gi}), by a loop over its 8 blocks of 32 columns (blocks
    mloop, then mdone): per pair I_s, the sum over blocks of each block's integer sum times
    its rows' 6-bit scales (vpmulld; |.| < 8 * 63 * 32 * 15 * 127 < 2^25), and M_s, the sum
    over blocks of the rows' 6-bit mins times the activations' code sums (C[t, 8b + j], as
    int16 pairs by the scratch's min pairs: vpmaddwd; |.| < 8 * 63 * 32 * 127 < 2^21)."""
    _sub_blocks_open(e, pairs)
    e("  %as = shl i64 %b, 8")
    e("  %am = shl i64 %m, 2")
    e("  %ab = add i64 %as, %am")
    e("  %mo = shl i64 %m, 8")
    sums = {p: "zeroinitializer" for p in pairs}
    for k in range(8):  # k-step 2j + h: the block's code vector k, the activations at 64j + 32h
        e(f"  %wq{k} = add i64 %mo, {32 * k}")
        _k_step(e, isa, tile, sums, k, f"%wq{k}", 64 * (k // 2) + 32 * (k % 2))
    scaled = _sub_blocks_close(e, pairs, sums, K4_SCALES, 8)
    e("  %cb = shl i64 %b, 3")
    for t in range(tile):  # the 8 blocks' code sums as int16, pairs (2q, 2q + 1) broadcast
        e(f"  %cp{t} = getelementptr i32, ptr %crow{t}, i64 %cb")
        e(f"  %cv{t} = load {_I8}, ptr %cp{t}, align 4")
        e(f"  %ch{t} = trunc {_I8} %cv{t} to <8 x i16>")
        e(f"  %cw{t} = bitcast <8 x i16> %ch{t} to <4 x i32>")
        for q in range(4):
            e(f"  %cq{t}_{q} = extractelement <4 x i32> %cw{t}, i32 {q}")
            broadcast(e, f"cs{t}_{q}", _I8, "i32", f"%cq{t}_{q}")
            e(f"  %csh{t}_{q} = bitcast {_I8} %cs{t}_{q} to {_W16}")
    for gi in range(GROUPS):
        for q in range(4):
            e(f"  %mnp{gi}_{q} = getelementptr i8, ptr %wb{gi}, i64 {K4_MINS + 32 * q}")
            e(f"  %mnv{gi}_{q} = load {_W16}, ptr %mnp{gi}_{q}, align 1")
    mins = {}
    for gi, t in pairs:
        p = f"{gi}_{t}"
        for q in range(4):
            e(f"  %mp{p}_{q} = call {_I8} @llvm.x86.avx2.pmadd.wd({_W16} %mnv{gi}_{q}, {_W16} %csh{t}_{q})")
        e(f"  %ms{p}_a = add {_I8} %mp{p}_0, %mp{p}_1")
        e(f"  %ms{p}_b = add {_I8} %mp{p}_2, %mp{p}_3")
        e(f"  %ms{p} = add {_I8} %ms{p}_a, %ms{p}_b")
        mins[(gi, t)] = f"%ms{p}"
    return scaled, mins


def _scale_terms(e: Emit, kind: str, tile: int) -> None:
    """The float factors of a block of the loop: %dw{gi} (the 8 rows' d as f32; k4 also %mw{gi},
    -dmin) and per activation row %sc{t}, its d_a broadcast."""
    for gi in range(GROUPS):
        e(f"  %dwp{gi} = getelementptr i8, ptr %wb{gi}, i64 {K4_D if kind == 'k4' else OUTER_BLOCK_BYTES[kind] - 32}")
        e(f"  %dw{gi} = load {_F8}, ptr %dwp{gi}, align 1")
        if kind == "k4":
            e(f"  %mwp{gi} = getelementptr i8, ptr %wb{gi}, i64 {K4_NDMIN}")
            e(f"  %mw{gi} = load {_F8}, ptr %mwp{gi}, align 1")
    if kind != "u5":
        e("  %sl = shl i64 %b, 5")  # S: 32 lanes per 256 columns
    for t in range(tile):
        e(f"  %sp{t} = getelementptr float, ptr %srow{t}, i64 %sl")
        e(f"  %sa{t} = load float, ptr %sp{t}, align 4")
        broadcast(e, f"sc{t}", _F8, "float", f"%sa{t}")


def product_ir(kind: str, name: str, signature: KernelSignature, tile: int, isa: str) -> str:
    """IR of the outer product kernel `name` of `kind` for `tile` activation rows (the module
    docstring's contract)."""
    pairs = [(gi, t) for gi in range(GROUPS) for t in range(tile)]
    lines: list[str] = []
    e = lines.append
    frame.entry(e, signature, name, 0)  # the pointers; it branches to %rloop
    e("rloop:")  # over passes of GROUPS row groups
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    # the block loop's count: u5 groups of 128 columns (4 blocks, one of each class), else super-blocks
    e(f"  %nloop = lshr i64 %nsteps, {1 if kind == 'u5' else 2}")
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
        rows_of = (("a", "Ap", "astride"), ("s", "Sp", "sstride"), ("c", "Cp", "cstride"))
        for v, base, stride in rows_of:
            e(f"  %{v}off{t} = mul i64 %trow{t}, %{stride}")
            e(f"  %{v}row{t} = getelementptr i8, ptr %{base}, i64 %{v}off{t}")
        e(f"  %ooff{t} = mul i64 %trow{t}, %ostride")
    u5 = kind == "u5"
    if u5:  # over the classes cls: blocks cls, cls + 4, c + 8, ... of a row, then out + the class's sums
        e("  br label %cloop")
        e("cloop:")
        e("  %cls = phi i64 [ 0, %tloop ], [ %clsn, %cdone ]")
        for gi, t in pairs:
            e(f"  %out{gi}_{t} = phi {_F8} [ zeroinitializer, %tloop ], [ %outn{gi}_{t}, %cdone ]")
    e("  br label %bloop")
    counter, before, latch = ("g", "cloop", "bloop") if u5 else ("b", "tloop", "mdone")
    e("bloop:")  # over blocks (u5: block 4g + cls of 32 columns; k4, u6: a super-block of 256)
    e(f"  %{counter} = phi i64 [ 0, %{before} ], [ %{counter}n, %{latch} ]")
    for gi, t in pairs:
        e(f"  %acc{gi}_{t} = phi {_F8} [ zeroinitializer, %{before} ], [ %accn{gi}_{t}, %{latch} ]")
    if u5:  # the scratch holds a row's blocks class by class: block 4g + cls at cls * nloop + g
        e("  %bcls = mul i64 %cls, %nloop")
        e("  %b = add i64 %bcls, %g")
    e(f"  %bo = mul i64 %b, {OUTER_BLOCK_BYTES[kind]}")
    for gi in range(GROUPS):
        e(f"  %wb{gi} = getelementptr i8, ptr %wrow{gi}, i64 %bo")
    mins: dict[tuple[int, int], str] = {}
    if kind == "k4":
        sums, mins = _k4_sums(e, tile, pairs, isa)
    else:
        sums = (_u5_sums if u5 else _u6_sums)(e, tile, pairs, isa)
    _scale_terms(e, kind, tile)
    for gi, t in pairs:  # acc = fma(f32(I), d * d_a, acc) (k4: then fma(f32(M), -dmin * d_a, acc))
        k = f"{gi}_{t}"
        e(f"  %f{k} = sitofp {_I8} {sums[(gi, t)]} to {_F8}")
        e(f"  %ds{k} = fmul {_F8} %dw{gi}, %sc{t}")
        last = "acs" if kind == "k4" else "accn"
        e(f"  %{last}{k} = call {_F8} @llvm.fma.v8f32({_F8} %f{k}, {_F8} %ds{k}, {_F8} %acc{k})")
        if kind == "k4":
            e(f"  %fm{k} = sitofp {_I8} {mins[(gi, t)]} to {_F8}")
            e(f"  %dm{k} = fmul {_F8} %mw{gi}, %sc{t}")
            e(f"  %accn{k} = call {_F8} @llvm.fma.v8f32({_F8} %fm{k}, {_F8} %dm{k}, {_F8} %acs{k})")
    e(f"  %{counter}n = add i64 %{counter}, 1")
    e(f"  %bmore = icmp ult i64 %{counter}n, %nloop")
    e(f"  br i1 %bmore, label %bloop, label %{'cdone' if u5 else 'tlatch'}")
    final = "accn"
    if u5:
        e("cdone:")  # out = ((acc0 + acc1) + acc2) + acc3: 0 + acc0 is acc0 (an fma chain from +0 is never -0)
        for gi, t in pairs:
            e(f"  %outn{gi}_{t} = fadd {_F8} %out{gi}_{t}, %accn{gi}_{t}")
        e("  %clsn = add i64 %cls, 1")
        e(f"  %cmore = icmp ult i64 %clsn, {U5_CLASSES}")
        e("  br i1 %cmore, label %cloop, label %tlatch")
        final = "outn"
    e("tlatch:")
    for gi, t in pairs:
        k = f"{gi}_{t}"
        e(f"  %oc{k} = add i64 %r, {8 * gi}")
        e(f"  %oi{k} = add i64 %ooff{t}, %oc{k}")
        e(f"  %op{k} = getelementptr float, ptr %outp, i64 %oi{k}")
        e(f"  store {_F8} %{final}{k}, ptr %op{k}, align 4")
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
