"""int8 dot-product kernels (VNNI vpdpbusd) written in LLVM IR and compiled by llvmlite.

numba's loop vectorizer does not turn int8 dot products into vpdpbusd (measured: 24
GMAC/s on one core with widening multiplies), and a C extension would need a compiler
at install. llvmlite is LLVM itself in a wheel (numba's dependency), so we write the
inner kernel as IR with the VNNI intrinsic and let LLVM do register allocation and
instruction selection for the host CPU. Absent VNNI (`available()` False), the numba
float kernels of kernels/cpu_quant.py are used instead.

One kernel computes a tile: weight rows [r0, r1) times TILE activation rows from t0,
over `nsteps` steps of 8 int32 lanes each. Per step and lane, one or two vpdpbusd give
an exact integer dot of 4 or 8 products, and then, in float,

    acc[t] += float(int dot) * (d_w[lane] * S[t, lane]) (+ m_w[lane] * N[t, lane], u4)

so that the sum of the 8 lanes of acc[t] is out[t, r]. Two weight layouts:

- u4: 64 weights per step in 32 bytes (two 32-blocks of kernels/cpu_quant's U4 layout:
  byte i of a block holds codes i and i + 16); activations int8 in the order
  [block0 0..15, block1 0..15, block0 16..31, block1 16..31]; d_w, m_w two numbers per
  step (lanes 0-3, 4-7).
- i8: 32 int8 weights per step against 32 int8 activations; vpdpbusd wants one operand
  unsigned, so it multiplies |w| by a * sign(w) (llama.cpp's trick); d_w one number per
  step (group 32) or two (group 16). No m_w.

Scales are stored as f16 where that is exact (Q4_0, Q4_1, Q8_0, Q5_0 keep GGUF's own
f16 scales, so the kernels stream no more bytes than llama.cpp), else f32 (K-quants,
whose per-32 scales are products of two numbers).
"""

from __future__ import annotations

import functools

ARGS = ("W", "D", "M", "A", "S", "N", "nsteps", "r0", "r1", "wstride", "dstride", "t0", "astride", "sstride", "out", "ostride")
TILE = 4  # activation rows per tile in the wide kernel
# (weight layout, d_w numbers per step, scales in f16)
VARIANTS = tuple((k, d, h) for k, d in (("u4", 2), ("i8", 1), ("i8", 2)) for h in (True, False))

_DECLS = """
declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <8 x i32>, <8 x i32>)
declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)
declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
"""
_SPREAD2 = "<8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 1, i32 1, i32 1, i32 1>"


def _splat(n: int, ty: str, v: int) -> str:
    return "<" + ", ".join([f"{ty} {v}"] * n) + ">"


def kernel_name(kind: str, dps: int, half: bool, tile: int) -> str:
    return f"{kind}_d{dps}_{'h' if half else 'f'}_t{tile}"


def kernel_ir(kind: str, dps: int, half: bool, tile: int) -> str:
    """IR of one kernel: void(i64 x 16) with the arguments of ARGS (pointers and byte strides)."""
    lines: list[str] = []
    e = lines.append
    e(f"define void @{kernel_name(kind, dps, half, tile)}(" + ", ".join(f"i64 %{a}" for a in ARGS) + ") {")
    e("entry:")
    for p in ("W", "D", "M", "A", "S", "N", "out"):
        e(f"  %{p}p = inttoptr i64 %{p} to ptr")
    for t in range(tile):  # per activation row of the tile: its A, S, N rows and out offset
        e(f"  %trow{t} = add i64 %t0, {t}")
        e(f"  %aoff{t} = mul i64 %trow{t}, %astride")
        e(f"  %arow{t} = getelementptr i8, ptr %Ap, i64 %aoff{t}")
        e(f"  %soff{t} = mul i64 %trow{t}, %sstride")
        e(f"  %srow{t} = getelementptr i8, ptr %Sp, i64 %soff{t}")
        e(f"  %nrow{t} = getelementptr i8, ptr %Np, i64 %soff{t}")
        e(f"  %ooff{t} = mul i64 %trow{t}, %ostride")
    e("  br label %rloop")
    e("rloop:")  # over weight rows
    e("  %r = phi i64 [ %r0, %entry ], [ %rn, %rlatch ]")
    e("  %woff = mul i64 %r, %wstride")
    e("  %wrow = getelementptr i8, ptr %Wp, i64 %woff")
    e("  %doff = mul i64 %r, %dstride")
    e("  %drow = getelementptr i8, ptr %Dp, i64 %doff")
    e("  %mrow = getelementptr i8, ptr %Mp, i64 %doff")
    e("  br label %sloop")
    e("sloop:")  # over steps of 8 lanes
    e("  %s = phi i64 [ 0, %rloop ], [ %sn, %sloop ]")
    for t in range(tile):
        e(f"  %acc{t} = phi <8 x float> [ zeroinitializer, %rloop ], [ %accn{t}, %sloop ]")
    e("  %wo = shl i64 %s, 5")
    e("  %wp = getelementptr i8, ptr %wrow, i64 %wo")
    e("  %w = load <32 x i8>, ptr %wp, align 1")
    if kind == "u4":
        e(f"  %lo = and <32 x i8> %w, {_splat(32, 'i8', 15)}")
        e(f"  %hi = lshr <32 x i8> %w, {_splat(32, 'i8', 4)}")
        e("  %lo32 = bitcast <32 x i8> %lo to <8 x i32>")
        e("  %hi32 = bitcast <32 x i8> %hi to <8 x i32>")
    else:
        e("  %wabs = call <32 x i8> @llvm.abs.v32i8(<32 x i8> %w, i1 false)")
        e("  %wabs32 = bitcast <32 x i8> %wabs to <8 x i32>")
    ty, size = ("half", 2) if half else ("float", 4)
    e(f"  %do = mul i64 %s, {dps * size}")
    for v in ("d", "m") if kind == "u4" else ("d",):
        e(f"  %{v}p = getelementptr i8, ptr %{v}row, i64 %do")
        vec = "<2 x {}>" if dps == 2 else "{}"
        e(f"  %{v}s = load {vec.format(ty)}, ptr %{v}p, align {size}")
        if half:
            e(f"  %{v}f = fpext {vec.format('half')} %{v}s to {vec.format('float')}")
        else:
            e(f"  %{v}f = bitcast {vec.format('float')} %{v}s to {vec.format('float')}")  # a no-op, for one name
        if dps == 2:
            e(f"  %{v}x = shufflevector <2 x float> %{v}f, <2 x float> poison, {_SPREAD2}")
        else:
            e(f"  %{v}i = insertelement <8 x float> poison, float %{v}f, i64 0")
            e(f"  %{v}x = shufflevector <8 x float> %{v}i, <8 x float> poison, <8 x i32> zeroinitializer")
    e(f"  %ao = shl i64 %s, {6 if kind == 'u4' else 5}")
    e("  %so = shl i64 %s, 5")
    for t in range(tile):
        e(f"  %ap{t} = getelementptr i8, ptr %arow{t}, i64 %ao")
        if kind == "u4":
            e(f"  %alo{t} = load <8 x i32>, ptr %ap{t}, align 1")
            e(f"  %aph{t} = getelementptr i8, ptr %ap{t}, i64 32")
            e(f"  %ahi{t} = load <8 x i32>, ptr %aph{t}, align 1")
            e(f"  %ia{t} = call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> zeroinitializer, <8 x i32> %lo32, <8 x i32> %alo{t})")
            e(f"  %ib{t} = call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> %ia{t}, <8 x i32> %hi32, <8 x i32> %ahi{t})")
        else:
            e(f"  %a{t} = load <32 x i8>, ptr %ap{t}, align 1")
            e(f"  %as{t} = call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> %a{t}, <32 x i8> %w)")
            e(f"  %as32{t} = bitcast <32 x i8> %as{t} to <8 x i32>")
            e(f"  %ib{t} = call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> zeroinitializer, <8 x i32> %wabs32, <8 x i32> %as32{t})")
        e(f"  %f{t} = sitofp <8 x i32> %ib{t} to <8 x float>")
        e(f"  %sp{t} = getelementptr i8, ptr %srow{t}, i64 %so")
        e(f"  %sc{t} = load <8 x float>, ptr %sp{t}, align 4")
        e(f"  %ds{t} = fmul <8 x float> %dx, %sc{t}")
        if kind == "u4":
            e(f"  %np{t} = getelementptr i8, ptr %nrow{t}, i64 %so")
            e(f"  %mn{t} = load <8 x float>, ptr %np{t}, align 4")
            e(f"  %q{t} = call <8 x float> @llvm.fma.v8f32(<8 x float> %f{t}, <8 x float> %ds{t}, <8 x float> %acc{t})")
            e(f"  %accn{t} = call <8 x float> @llvm.fma.v8f32(<8 x float> %mx, <8 x float> %mn{t}, <8 x float> %q{t})")
        else:
            e(f"  %accn{t} = call <8 x float> @llvm.fma.v8f32(<8 x float> %f{t}, <8 x float> %ds{t}, <8 x float> %acc{t})")
    e("  %sn = add i64 %s, 1")
    e("  %more = icmp ult i64 %sn, %nsteps")
    e("  br i1 %more, label %sloop, label %rlatch")
    e("rlatch:")  # 8 lanes -> out[t, r]
    for t in range(tile):
        e(f"  %red{t} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, <8 x float> %accn{t})")
        e(f"  %oi{t} = add i64 %ooff{t}, %r")
        e(f"  %op{t} = getelementptr float, ptr %outp, i64 %oi{t}")
        e(f"  store float %red{t}, ptr %op{t}, align 4")
    e("  %rn = add i64 %r, 1")
    e("  %rmore = icmp ult i64 %rn, %r1")
    e("  br i1 %rmore, label %rloop, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(lines)


def _host_has_vnni(features: str) -> bool:
    flags = set(features.split(","))
    return {"+avx512vnni", "+avx512vl", "+avx512bw"} <= flags


@functools.cache
def addresses() -> dict[tuple[str, int, bool, int], int] | None:
    """Machine-code addresses of every kernel, (kind, dps, half, tile) -> address; None when
    the host CPU lacks AVX512-VNNI or llvmlite cannot compile for it."""
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        features = llvm.get_host_cpu_features().flatten()
        if not _host_has_vnni(features):
            return None
        keys = [(k, d, h, t) for k, d, h in VARIANTS for t in (1, TILE)]
        module = llvm.parse_assembly(_DECLS + "\n".join(kernel_ir(*key) for key in keys))
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=3)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        _ENGINES.append(engine)  # the code lives as long as its engine
        return {key: engine.get_function_address(kernel_name(*key)) for key in keys}
    except (ImportError, RuntimeError, OSError):
        return None


_ENGINES: list = []


def available() -> bool:
    """Whether the int8 kernels run on this machine."""
    return addresses() is not None
