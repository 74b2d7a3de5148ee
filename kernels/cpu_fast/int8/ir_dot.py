"""The integer dot product of the int8 kernels (ir.py), per instruction set.

Per int32 lane, acc + the sum of 4 products of an unsigned byte (u) by a signed byte (s):
- "vnni": one vpdpbusd (AVX512-VNNI with AVX512VL).
- "avx2": vpmaddubsw (pairs of products summed into int16, saturating) then vpmaddwd by 1
  (pairs of int16 into int32) and an add, as llama.cpp's AVX2 kernels do. Exact where no
  pair sum leaves int16: every caller's unsigned bytes are at most 128 (|w|, or codes
  below 64) and its signed ones at least -127 (activations rounded to [-127, 127]), so
  |u0 s0 + u1 s1| <= 2 * 128 * 127 = 32512. The integers equal VNNI's, and the float
  operations after them are the same IR (the host's LLVM may order the final 8-lane sum
  differently).

Operands are IR values of type <8 x i32> (4 bytes a lane); each call appends lines through
`e` and defines %name.
"""

from __future__ import annotations

from zinfer.kernels.cpu_fast.int8.ir_scales import Emit, splat

DECLS = """
declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
"""
_I8 = "<8 x i32>"
_B32 = "<32 x i8>"
_W16 = "<16 x i16>"


def host_isa(features: str) -> str | None:
    """The instruction set of the int8 kernels on a CPU with these LLVM features
    ("+avx2,+avx512vnni,..."): "vnni", "avx2", or None (no int8 kernels)."""
    flags = set(features.split(","))
    if {"+avx512vnni", "+avx512vl", "+avx512bw"} <= flags:
        return "vnni"
    return "avx2" if {"+avx2", "+fma", "+f16c"} <= flags else None


def _pairs16(e: Emit, name: str, u: str, s: str) -> None:
    """%name = <16 x i16>: the pair sums of u's unsigned by s's signed bytes (vpmaddubsw)."""
    e(f"  %{name}u = bitcast {_I8} {u} to {_B32}")
    e(f"  %{name}s = bitcast {_I8} {s} to {_B32}")
    e(f"  %{name} = call {_W16} @llvm.x86.avx2.pmadd.ub.sw({_B32} %{name}u, {_B32} %{name}s)")


def _widen_add(e: Emit, name: str, acc: str, pairs: str) -> None:
    """%name = acc + the <16 x i16> `pairs` summed two by two into int32 lanes (vpmaddwd by 1)."""
    widened = f"call {_I8} @llvm.x86.avx2.pmadd.wd({_W16} {pairs}, {_W16} {splat(16, 'i16', 1)})"
    if acc == "zeroinitializer":
        e(f"  %{name} = {widened}")
        return
    e(f"  %{name}w = {widened}")
    e(f"  %{name} = add {_I8} {acc}, %{name}w")


def dot(e: Emit, isa: str, name: str, acc: str, u: str, s: str) -> None:
    """%name = acc + per lane the dot of u's 4 unsigned by s's 4 signed bytes."""
    if isa == "vnni":
        e(f"  %{name} = call {_I8} @llvm.x86.avx512.vpdpbusd.256({_I8} {acc}, {_I8} {u}, {_I8} {s})")
        return
    _pairs16(e, f"{name}p", u, s)
    _widen_add(e, name, acc, f"%{name}p")


def dot2_small(e: Emit, isa: str, name: str, acc: str, u1: str, s1: str, u2: str, s2: str) -> None:
    """%name = acc + dot(u1, s1) + dot(u2, s2), where u1 and u2 are codes below 32: on AVX2
    the two int16 pair sums are added before widening (|sum| <= 4 * 31 * 127 = 15748)."""
    if isa == "vnni":
        dot(e, isa, f"{name}a", acc, u1, s1)
        dot(e, isa, name, f"%{name}a", u2, s2)
        return
    _pairs16(e, f"{name}p1", u1, s1)
    _pairs16(e, f"{name}p2", u2, s2)
    e(f"  %{name}p = add {_W16} %{name}p1, %{name}p2")
    _widen_add(e, name, acc, f"%{name}p")
