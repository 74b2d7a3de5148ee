"""The u5 (Q5_0) kernel: one 32-block per pair of int32 lanes over 128 columns, so its
f16 scales apply in float once per 4 blocks.

Q5_0's scale is an f16 per 32 columns, so the float work cannot wait for a super-block
as in ir_super.py. In the layout of ir.py each step's 8 int32 lanes
held two blocks (4 lanes each, 8 products a lane) and every step paid a conversion, a
multiply and an fma per (weight row, activation row): with its 2 vpdpbusd, 4 operations
on the 2 pipes that Zen 4 issues them on, for 64 products. In the u5 order
(layouts.U5_COLUMNS) a group of 128 columns (4 blocks, 2 steps) is 4 code
vectors whose bytes 8b..8b + 7 lie in block b, so lanes 2b and 2b + 1 sum block b over
the group (16 products a lane) and the float work is once per group: 4 vpdpbusd, then
the conversion, multiply and fma, for 128 products.

Per group and lane, with the codes' offset first (C: -16 times the lane's 16
activations, products' activations), the integer is exact (|.| <= 16 * 31 * 127); lanes
2b and 2b + 1 add into block b's integer I_b, and (ir_order's shared order, class b)

    acc[b] = fma(f32(I_b), d_w[b] * S[t, 2b], acc[b])

with d_w the f16 scale of the block and S the activations' per-block scale (the
group's 8 lanes at S[t, 16 g], and C's at C[t, 16 g]); out = ((acc0 + acc1) + acc2) + acc3.
The 2 steps are a loop that LLVM must not unroll (ir_frame.never_unrolled). On AVX2 hosts the pair of vpdpbusd of a
step is ir_dot.dot2_small (codes below 32).
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8 import ir_frame as frame
from zinfer.kernels.cpu_fast.int8 import ir_order as order
from zinfer.kernels.cpu_fast.int8.ir_dot import dot2_small
from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, bit4s, splat
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

STEP_BYTES = 40  # per 64 columns: 32 nibble bytes, 8 bytes of bit 4
GROUP_STEPS = 2  # steps per group of 128 columns (4 blocks)
GROUP_LANES = 16  # S and C lanes per group (the first 8 are read)

_F8 = "<8 x float>"
_I8 = "<8 x i32>"
_B32 = "<32 x i8>"


def kernel_ir(
    tile: int, rows: int, name: str, signature: KernelSignature, prefetch: int, locality: int, isa: str
) -> str:
    """IR of the u5 kernel `name` for `tile` activation rows and `rows` weight rows per pass
    (ir.kernel_ir's contract; nsteps even), prefetching weights `prefetch` bytes ahead
    with llvm.prefetch's `locality`."""
    pairs = [(i, t) for i in range(rows) for t in range(tile)]
    lines: list[str] = []
    meta: list[str] = []
    e = lines.append
    frame.entry(e, signature, name, tile)
    frame.row_pass(e, rows, "gloop")

    e("gloop:")  # over groups of 128 columns
    e("  %g = phi i64 [ 0, %rloop ], [ %gn, %jdone ]")
    accs = [f"%acc{k}" for k in range(order.count(len(pairs), 2))]
    for k, acc in enumerate(accs):
        e(f"  {acc} = phi {_F8} [ zeroinitializer, %rloop ], [ %sum{k}, %jdone ]")
    e("  %gs = shl i64 %g, 1")  # the group's first step
    e("  %go = shl i64 %g, 6")  # 64 bytes of S (16 floats) and of C (16 int32) per group
    for t in range(tile):
        e(f"  %cp{t} = getelementptr i8, ptr %crow{t}, i64 %go")
        e(f"  %nc{t} = load {_I8}, ptr %cp{t}, align 4")
    _steps(e, meta, rows, tile, pairs, prefetch, locality, isa)
    for i in range(rows):  # the 4 blocks' f16 scales, each over 2 lanes
        e(f"  %dof{i} = shl i64 %g, 3")
        e(f"  %dp{i} = getelementptr i8, ptr %drow{i}, i64 %dof{i}")
        e(f"  %dh{i} = load <4 x half>, ptr %dp{i}, align 2")
        e(f"  %df{i} = fpext <4 x half> %dh{i} to <4 x float>")
        pairs_of_4 = "<8 x i32> <i32 0, i32 0, i32 1, i32 1, i32 2, i32 2, i32 3, i32 3>"
        e(f"  %dx{i} = shufflevector <4 x float> %df{i}, <4 x float> poison, {pairs_of_4}")
    for t in range(tile):
        e(f"  %sp{t} = getelementptr i8, ptr %srow{t}, i64 %go")
        e(f"  %sc{t} = load {_F8}, ptr %sp{t}, align 4")
    # lanes 2b, 2b + 1: block b of the group (class b), one exact integer each (ir_order)
    reduced = order.reduce_runs(e, "rd", [f"%q{i}_{t}" for i, t in pairs], 2)
    ds = order.scaled(e, "ds", reduced, lambda p, c: (f"%dx{pairs[p][0]}", 2 * c),
                      lambda p, c: (f"%sc{pairs[p][1]}", 2 * c), {})
    order.fma_into(e, "sum", order.as_floats(e, "fi", reduced), ds, accs)
    e("  %gn = add i64 %g, 1")
    e(f"  %ngroups = lshr i64 %nsteps, {GROUP_STEPS.bit_length() - 1}")
    e("  %more = icmp ult i64 %gn, %ngroups")
    e("  br i1 %more, label %gloop, label %rlatch")
    e("rlatch:")
    order.store(e, reduced, [f"%sum{k}" for k in range(len(reduced))], pairs, 4)
    frame.latch(e, rows)
    return "\n".join(lines + meta)


def _steps(
    e: Emit, meta: list[str], rows: int, tile: int, pairs: list[tuple[int, int]], prefetch: int, locality: int, isa: str
) -> None:
    """The group's 2 steps as a loop (blocks jloop, then jdone): %q{i}_{t} = the offset
    %nc{t} plus every code by its activation, per lane."""
    e("  br label %jloop")
    e("jloop:")
    e("  %j = phi i64 [ 0, %gloop ], [ %jn, %jloop ]")
    for i, t in pairs:
        e(f"  %qa{i}_{t} = phi {_I8} [ %nc{t}, %gloop ], [ %q{i}_{t}, %jloop ]")
    e("  %sj = add i64 %gs, %j")
    e(f"  %wo = mul i64 %sj, {STEP_BYTES}")
    for i in range(rows):
        e(f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %wo")
        e(f"  %pf{i} = getelementptr i8, ptr %wp{i}, i64 {prefetch}")
        e(f"  call void @llvm.prefetch.p0(ptr %pf{i}, i32 0, i32 {locality}, i32 1)")  # read, streamed once
        e(f"  %w{i} = load {_B32}, ptr %wp{i}, align 1")
        e(f"  %l4{i} = and {_B32} %w{i}, {splat(32, 'i8', 15)}")
        e(f"  %h4{i} = lshr {_B32} %w{i}, {splat(32, 'i8', 4)}")
        bit4s(e, f"lb{i}", f"hb{i}", f"%wp{i}", 32)
        for v, low in (("lo", "l4"), ("hi", "h4")):
            e(f"  %{v}c{i} = or {_B32} %{low}{i}, %{v[0]}b{i}")
            e(f"  %{v}{i} = bitcast {_B32} %{v}c{i} to {_I8}")
    e("  %ao = shl i64 %sj, 6")
    for t in range(tile):
        e(f"  %ap{t} = getelementptr i8, ptr %arow{t}, i64 %ao")
        e(f"  %alo{t} = load {_I8}, ptr %ap{t}, align 1")
        e(f"  %aph{t} = getelementptr i8, ptr %ap{t}, i64 32")
        e(f"  %ahi{t} = load {_I8}, ptr %aph{t}, align 1")
    for i, t in pairs:
        dot2_small(e, isa, f"q{i}_{t}", f"%qa{i}_{t}", f"%lo{i}", f"%alo{t}", f"%hi{i}", f"%ahi{t}")
    e("  %jn = add i64 %j, 1")
    e(f"  %jmore = icmp ult i64 %jn, {GROUP_STEPS}")
    e(f"  br i1 %jmore, label %jloop, label %jdone, {frame.never_unrolled(meta)}")
    e("jdone:")
