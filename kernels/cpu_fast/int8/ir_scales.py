"""IR snippets of the int8 kernels (ir.py, ir_super.py) that turn a
weight row's stored bytes into what the step loop multiplies: scales spread over the 8
lanes (f16 or f32 as stored; k4's mins formed from the file's f16 dmin and integer mins,
exactly as cpu_quant forms them in f32) and high bits turned into bytes. Each
appends lines through `e` and defines the named values; names are the caller's, unique
per weight row."""

from __future__ import annotations

from collections.abc import Callable, Iterable

Emit = Callable[[str], None]  # appends one line to the IR being written
K4_SUPER_BYTES = 20  # k4's D per 256 columns: f16 d, f16 dmin, 8 uint8 scales, 8 uint8 mins
U6_SUPER_BYTES = 18  # u6's D per 256 columns: f16 d, 16 int8 scales (one per 16 columns)
SPREAD2 = "<8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 1, i32 1, i32 1, i32 1>"  # 2 values over lanes 0-3, 4-7
_F8 = "<8 x float>"


def splat(n: int, ty: str, v: int) -> str:
    """The IR constant <n x ty> with every element v."""
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def shuffle_mask(values: Iterable[int]) -> str:
    """The IR constant <n x i32> of shufflevector's lane indices `values`."""
    return "<" + ", ".join(f"i32 {v}" for v in values) + ">"


def broadcast(e: Emit, name: str, vector: str, scalar_type: str, value: str) -> None:
    """%name = `vector` (e.g. <8 x i32>) with the scalar `value` in every lane."""
    e(f"  %{name}i = insertelement {vector} poison, {scalar_type} {value}, i32 0")
    e(f"  %{name} = shufflevector {vector} %{name}i, {vector} poison, <8 x i32> zeroinitializer")


def scale_vector(e: Emit, name: str, ptr: str, offset: str, count: int, half: bool) -> None:
    """%name = `count` scales at ptr + offset (f16 or f32), spread over 8 float lanes."""
    ty, size = ("half", 2) if half else ("float", 4)
    vec = f"<{count} x {ty}>" if count > 1 else ty
    e(f"  %{name}p = getelementptr i8, ptr {ptr}, i64 {offset}")
    e(f"  %{name}s = load {vec}, ptr %{name}p, align {size}")
    fvec = f"<{count} x float>" if count > 1 else "float"
    if half:
        e(f"  %{name}f = fpext {vec} %{name}s to {fvec}")
    else:
        e(f"  %{name}f = fadd {fvec} %{name}s, {'zeroinitializer' if count > 1 else '0.0'}")
    if count == 8:
        e(f"  %{name} = fadd {_F8} %{name}f, zeroinitializer")
    elif count == 2:
        e(f"  %{name} = shufflevector <2 x float> %{name}f, <2 x float> poison, {SPREAD2}")
    else:
        e(f"  %{name}i = insertelement {_F8} poison, float %{name}f, i64 0")
        e(f"  %{name} = shufflevector {_F8} %{name}i, {_F8} poison, <8 x i32> zeroinitializer")


def _broadcast8(e: Emit, name: str, ptr: str, offset: int) -> None:
    """%name = <4 x i64>: the 8 bytes at ptr + offset in each 64-bit lane."""
    e(f"  %{name}p = getelementptr i8, ptr {ptr}, i64 {offset}")
    e(f"  %{name}w = load i64, ptr %{name}p, align 1")
    e(f"  %{name}i = insertelement <4 x i64> poison, i64 %{name}w, i64 0")
    e(f"  %{name} = shufflevector <4 x i64> %{name}i, <4 x i64> poison, <4 x i32> zeroinitializer")


def _masked(e: Emit, name: str, shifted: str, mask: int) -> None:
    """%name = <32 x i8>: the bytes of <4 x i64> `shifted`, each and `mask`."""
    e(f"  %{name}c = bitcast <4 x i64> {shifted} to <32 x i8>")
    e(f"  %{name} = and <32 x i8> %{name}c, {splat(32, 'i8', mask)}")


def bit4s(e: Emit, low: str, high: str, ptr: str, offset: int) -> None:
    """%low, %high = <32 x i8>: byte k = 16 * bit 4 of the low (high) vector's code k, from the
    8 bytes at ptr + offset where byte j holds code 8l + j's bit at l (4 + l) (the u5 layout)."""
    _broadcast8(e, f"{low}q", ptr, offset)
    e(f"  %{low}s = shl <4 x i64> %{low}q, <i64 4, i64 3, i64 2, i64 1>")  # lane l: bit l to bit 4
    _masked(e, low, f"%{low}s", 0x10)
    e(f"  %{high}s = lshr <4 x i64> %{low}q, <i64 0, i64 1, i64 2, i64 3>")  # lane l: bit 4 + l to bit 4
    _masked(e, high, f"%{high}s", 0x10)


def high_pairs(e: Emit, low: str, high: str, ptr: str, offset: int) -> None:
    """%low, %high = <32 x i8>: byte k = (bits 4-5 of the low (high) vector's code k) << 4,
    from the 16 bytes at ptr + offset where byte j holds at bits 0-1, 2-3, 4-5, 6-7 those
    of the low vector's codes j and 16 + j and of the high vector's j and 16 + j
    (layouts.py's u6): the 16 bytes in both 128-bit halves, then half h
    shifts its field to bits 4-5."""
    e(f"  %{low}p = getelementptr i8, ptr {ptr}, i64 {offset}")
    e(f"  %{low}w = load <2 x i64>, ptr %{low}p, align 1")
    e(f"  %{low}q = shufflevector <2 x i64> %{low}w, <2 x i64> poison, <4 x i32> <i32 0, i32 1, i32 0, i32 1>")
    e(f"  %{low}s = shl <4 x i64> %{low}q, <i64 4, i64 4, i64 2, i64 2>")  # bits 2h to 4
    _masked(e, low, f"%{low}s", 0x30)
    e(f"  %{high}s = lshr <4 x i64> %{low}q, <i64 0, i64 0, i64 2, i64 2>")  # bits 4 + 2h to 4
    _masked(e, high, f"%{high}s", 0x30)


def k4_mins(e: Emit, name: str, i: int, sup: str) -> None:
    """%name over 8 lanes: k4's -dmin (the f16 at D row i + sup + 2) times the super-block's
    8 uint8 mins (at + 12): exact in f32 (11 by 6 significant bits)."""
    e(f"  %{name}sp = getelementptr i8, ptr %drow{i}, i64 {sup}")
    e(f"  %{name}hp = getelementptr i8, ptr %{name}sp, i64 2")
    e(f"  %{name}h = load half, ptr %{name}hp, align 1")
    e(f"  %{name}f = fpext half %{name}h to float")
    e(f"  %{name}g = fneg float %{name}f")
    e(f"  %{name}i = insertelement {_F8} poison, float %{name}g, i64 0")
    e(f"  %{name}b = shufflevector {_F8} %{name}i, {_F8} poison, <8 x i32> zeroinitializer")
    e(f"  %{name}qp = getelementptr i8, ptr %{name}sp, i64 12")
    e(f"  %{name}q = load <8 x i8>, ptr %{name}qp, align 1")
    e(f"  %{name}qf = uitofp <8 x i8> %{name}q to {_F8}")
    e(f"  %{name} = fmul {_F8} %{name}b, %{name}qf")
