"""The loops around the step loop of every int8 kernel (ir.py, ir_super.py):
the entry (pointers to each activation row of the tile), the pass over `rows` weight rows,
and the i8 kernels' store of each 8-lane sum to out[t, r].

Each function appends IR lines through `e`. The names it defines are the kernels' shared
vocabulary: %arow{t} %srow{t} %nrow{t} %crow{t} (activation row t's A, S, N and C), %ooff{t}, and per
weight row i of a pass %row{i} %wrow{i} %drow{i} %mrow{i}.
"""

from __future__ import annotations

import itertools

from zinfer.kernels.cpu_fast.int8.ir_scales import Emit
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

# metadata numbers of never-unrolled loops (and + 1), unique in a process's modules
_LOOP_IDS = itertools.count(1_000_000, 2)


def never_unrolled(meta: list[str]) -> str:
    """The `!llvm.loop !N` attachment for a loop's back branch that LLVM must not unroll;
    its metadata nodes are appended to `meta` (module level: after the function). The
    kernels' short inner loops (4 steps of a super-block) are loops for this: unrolled,
    LLVM's scheduler hoists their loads, and the 32 vector registers spill."""
    loop = next(_LOOP_IDS)
    meta.append(f"!{loop} = distinct !{{!{loop}, !{loop + 1}}}")
    meta.append(f'!{loop + 1} = !{{!"llvm.loop.unroll.disable"}}')
    return f"!llvm.loop !{loop}"

_F8 = "<8 x float>"


def entry(e: Emit, signature: KernelSignature, name: str, tile: int) -> None:
    """Open kernel `name`: its pointers, and per activation row t its A, S, N rows and out offset.

    A tile may be called for fewer rows than it has (t1 - t0 < tile: 3 rows on the 4-row
    tile, one pass over the weights instead of a 2-row and a 1-row pass): its rows past t1
    repeat row t1 - 1, reading its activations and storing the same sums to the same place."""
    e(signature.define(name))
    e("entry:")
    for p in signature.addresses:
        e(f"  %{p}p = inttoptr i64 %{p} to ptr")
    if tile > 1:
        e("  %tlast = add i64 %t1, -1")
    for t in range(tile):
        if t == 0:
            e("  %trow0 = add i64 %t0, 0")
        else:
            e(f"  %tnext{t} = add i64 %t0, {t}")
            e(f"  %tin{t} = icmp slt i64 %tnext{t}, %t1")
            e(f"  %trow{t} = select i1 %tin{t}, i64 %tnext{t}, i64 %tlast")
        rows_of = (("a", "Ap", "astride"), ("s", "Sp", "sstride"), ("n", "Np", "nstride"), ("c", "Cp", "cstride"))
        for v, base, stride in rows_of:
            e(f"  %{v}off{t} = mul i64 %trow{t}, %{stride}")
            e(f"  %{v}row{t} = getelementptr i8, ptr %{base}, i64 %{v}off{t}")
        e(f"  %ooff{t} = mul i64 %trow{t}, %ostride")
    e("  br label %rloop")


def row_pass(e: Emit, rows: int, first: str) -> None:
    """The block `rloop` over passes of `rows` weight rows from %r0 (entered from entry),
    with row i's W, D and M pointers; it falls into block `first`."""
    e("rloop:")
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    for i in range(rows):
        e(f"  %row{i} = add i64 %r, {i}")
        e(f"  %woff{i} = mul i64 %row{i}, %wstride")
        e(f"  %wrow{i} = getelementptr i8, ptr %Wp, i64 %woff{i}")
        e(f"  %doff{i} = mul i64 %row{i}, %dstride")
        e(f"  %drow{i} = getelementptr i8, ptr %Dp, i64 %doff{i}")
        e(f"  %mrow{i} = getelementptr i8, ptr %Mp, i64 %doff{i}")
    e(f"  br label %{first}")


def store(e: Emit, pairs: list[tuple[int, int]], rows: int, accs: str) -> None:
    """The block `rlatch`: each pair's 8 lanes %{accs}{i}_{t} summed into out[t, r]; the next
    pass or the end of the kernel (the i8 kernels'; the others fold by ir_order.store)."""
    e("rlatch:")
    for i, t in pairs:
        k = f"{i}_{t}"
        e(f"  %red{k} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, {_F8} %{accs}{k})")
        e(f"  %oi{k} = add i64 %ooff{t}, %row{i}")
        e(f"  %op{k} = getelementptr float, ptr %outp, i64 %oi{k}")
        e(f"  store float %red{k}, ptr %op{k}, align 4")
    latch(e, rows)


def latch(e: Emit, rows: int) -> None:
    """The end of block `rlatch`: the next pass of `rows` weight rows, or the end of the kernel."""
    e(f"  %rn = add i64 %r, {rows}")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %rloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
