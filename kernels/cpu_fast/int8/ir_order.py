"""The float steps of the int8 row kernels in the one order every int8 path shares
(tests/int8_canonical.py states it; the outer products and the AMX tiles follow it too), so
a row's result does not depend on the path its round took.

A row kernel's 8 int32 lanes hold parts of a step's blocks: run c of `width` consecutive
lanes (c = 0 .. 8 / width - 1) belongs to the step's c-th block (u4, p8: 2 blocks of 4
lanes; u5: 4 of 2 lanes; k4, u6: one super-block of 8). `reduce_runs` adds each run into
one exact integer, several (weight row, activation row) pairs per vector; `scaled`,
`as_floats` and `fma_into` apply the scales, one fma per vector into sums kept by class (the
run's index c); `store` folds each pair's classes left to right into out[t, r]. Integer
sums are exact in any order, so only the fma and the fold are ordered, and they are the
reference's.

A lane is labelled (pair, class) or None (padding, never read). Each function appends IR
through `e`; names are the caller's prefix plus an index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, shuffle_mask

_F8 = "<8 x float>"
_I8 = "<8 x i32>"
Label = tuple[int, int] | None  # (pair, class) of a lane, None for padding
Pick = tuple[str, int] | None  # (IR <8 x float> value, lane) a gathered lane comes from, None: any
Made = dict[tuple[Pick, ...], str]  # gathers already built: their picks -> IR value


class Reduced(NamedTuple):
    """An <8 x i32> IR value whose lane k is the exact integer of labels[k]."""

    value: str
    labels: tuple[Label, ...]


def reduce_runs(e: Emit, name: str, vectors: list[str], width: int) -> list[Reduced]:
    """Each run of `width` lanes of each pair's vector (vectors[p], <8 x i32>) summed into
    one lane, by a tree of even/odd shuffles and adds; count() vectors, their lanes labelled."""
    items = [Reduced(v, tuple((p, lane // width) for lane in range(8))) for p, v in enumerate(vectors)]
    level = 0
    while width > 1:
        merged: list[Reduced] = []
        for k in range(0, len(items), 2):
            x = items[k]
            y = items[k + 1] if k + 1 < len(items) else Reduced("zeroinitializer", (None,) * 8)
            z = f"%{name}l{level}_{k // 2}"
            e(f"  {z}e = shufflevector {_I8} {x.value}, {_I8} {y.value}, <8 x i32> {shuffle_mask(range(0, 16, 2))}")
            e(f"  {z}o = shufflevector {_I8} {x.value}, {_I8} {y.value}, <8 x i32> {shuffle_mask(range(1, 16, 2))}")
            e(f"  {z} = add {_I8} {z}e, {z}o")
            merged.append(Reduced(z, x.labels[0::2] + y.labels[0::2]))
        items, width, level = merged, width // 2, level + 1
    return items


def gather(e: Emit, name: str, picks: list[Pick], made: Made) -> str:
    """An <8 x float> whose lane k is lane picks[k][1] of the <8 x float> IR value
    picks[k][0] (any value where picks[k] is None), by a chain of shufflevectors, one per
    source after the first; `made` remembers what was built (the same picks once per block of IR)."""
    key = tuple(picks)
    if key in made:
        return made[key]
    sources = list(dict.fromkeys(p[0] for p in picks if p is not None))
    value = f"%{name}g{len(made)}"
    if len(sources) == 1:
        mask = [0 if p is None else p[1] for p in picks]
        e(f"  {value} = shufflevector {_F8} {sources[0]}, {_F8} poison, <8 x i32> {shuffle_mask(mask)}")
    else:
        current, placed = sources[0], {sources[0]}
        for n, source in enumerate(sources[1:]):
            mask = []
            for k, p in enumerate(picks):
                if p is not None and p[0] == source:
                    mask.append(8 + p[1])
                elif p is not None and p[0] in placed:
                    mask.append(p[1] if n == 0 else k)  # from the first source as it is, then where it was put
                else:
                    mask.append(k if n else 0)
            step = f"{value}_{n}"
            e(f"  {step} = shufflevector {_F8} {current}, {_F8} {source}, <8 x i32> {shuffle_mask(mask)}")
            current = step
            placed.add(source)
        value = current
    made[key] = value
    return value


Where = Callable[[int, int], tuple[str, int]]  # (pair, class) -> (IR <8 x float> value, lane) holding a factor


def scaled(e: Emit, name: str, reduced: list[Reduced], left: Where, right: Where, made: Made) -> list[str]:
    """Per reduced vector, an <8 x float> whose lane of label (p, c) is left(p, c) * right(p, c)
    (one f32 multiply; the factors gathered by shuffles, each arrangement built once per `made`)."""
    out = []
    for k, r in enumerate(reduced):
        a = gather(e, f"{name}l", [None if lb is None else left(*lb) for lb in r.labels], made)
        b = gather(e, f"{name}r", [None if lb is None else right(*lb) for lb in r.labels], made)
        e(f"  %{name}{k} = fmul {_F8} {a}, {b}")
        out.append(f"%{name}{k}")
    return out


def as_floats(e: Emit, name: str, reduced: list[Reduced]) -> list[str]:
    """Each reduced vector's integers as f32 (exact below 2^24; one rounding above)."""
    for k, r in enumerate(reduced):
        e(f"  %{name}{k} = sitofp {_I8} {r.value} to {_F8}")
    return [f"%{name}{k}" for k in range(len(reduced))]


def fma_into(e: Emit, name: str, values: list[str], factors: list[str], accs: list[str]) -> list[str]:
    """accs[k] = fma(values[k], factors[k], accs[k]), each lane rounded once; the new names."""
    for k, (v, f, a) in enumerate(zip(values, factors, accs)):
        e(f"  %{name}{k} = call {_F8} @llvm.fma.v8f32({_F8} {v}, {_F8} {f}, {_F8} {a})")
    return [f"%{name}{k}" for k in range(len(values))]


def count(pairs: int, width: int) -> int:
    """How many vectors reduce_runs makes of `pairs` vectors with runs of `width` lanes."""
    return len(reduce_runs(lambda _: None, "x", ["%v"] * pairs, width))


def store(e: Emit, reduced: list[Reduced], sums: list[str], pair_of: list[tuple[int, int]], classes: int) -> None:
    """out[t, r] for each pair p (pair_of[p] = (weight row i, activation row t)): its
    classes' sums folded left to right ((s0 + s1) + s2) + s3, stored (block rlatch's body)."""
    where: dict[tuple[int, int], tuple[str, int]] = {}
    for r, s in zip(reduced, sums):
        for lane, label in enumerate(r.labels):
            if label is not None:
                where[label] = (s, lane)
    for p, (i, t) in enumerate(pair_of):
        total = ""
        for c in range(classes):
            s, lane = where[(p, c)]
            e(f"  %fold{p}_{c} = extractelement {_F8} {s}, i64 {lane}")
            if c:
                e(f"  %fsum{p}_{c} = fadd float {total}, %fold{p}_{c}")
            total = f"%fsum{p}_{c}" if c else f"%fold{p}_{c}"
        e(f"  %oi{i}_{t} = add i64 %ooff{t}, %row{i}")
        e(f"  %op{i}_{t} = getelementptr float, ptr %outp, i64 %oi{i}_{t}")
        e(f"  store float {total}, ptr %op{i}_{t}, align 4")
