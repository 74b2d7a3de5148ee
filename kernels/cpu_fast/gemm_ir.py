"""A float32 matrix-product micro-kernel written in LLVM IR and compiled by llvmlite.

numba vectorizes elementwise loops well but not the register-blocked inner loop of a
matrix product, and attention's two products (scores = Q K^T, out = P V) otherwise
need BLAS, whose worker threads fight numba's for the cores in a round that uses both.
This kernel computes one rows x 16 block of C with broadcast-fma: per k, the 16 floats of
B's row k and a broadcast of A[r, k] feed one fma per row and vector into accumulators that
stay in registers. It needs nothing but LLVM's generic vector IR, so it compiles for any host
llvmlite supports.

Every C element is the same fma chain over k from zero whatever the kernel's rows and vector
width, so the kernels' results are equal bit for bit: decode (MR rows, two 8-float vectors a
row) and prefill (prefill_rows(): WIDE_MR rows of one 16-float vector where the host has
AVX-512, whose 32 registers hold the accumulators and a row of B; each B row loaded then
feeds 4x the fmas, so a chunk's keys and values stream through the caches a quarter as often).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from zinfer.kernels.cpu_fast import llvm_host
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

MR = 4  # rows of C per call of the decode kernel (two 8-float vectors a row)
WIDE_MR = 16  # rows of C per call of the AVX-512 prefill kernel (one 16-float vector a row)
NR = 16  # columns of C per call


class GemmArgs(NamedTuple):
    """The kernel's parameters, in order: float32 arrays' addresses, strides in floats."""

    A: int  # address of A [MR, >= K]
    lda: int  # floats between rows of A
    B: int  # address of B [K, >= 16]
    ldb: int  # floats between rows of B
    C: int  # address of C [MR, >= 16] (written)
    ldc: int  # floats between rows of C
    K: int  # the summed dimension, >= 1


SIGNATURE = KernelSignature(GemmArgs, addresses=("A", "B", "C"))
ARGS = SIGNATURE.names


def kernel_name(mr: int) -> str:
    """The symbol of the kernel of `mr` rows."""
    return f"sgemm_{mr}x16"


def kernel_ir(mr: int = MR) -> str:
    """IR of void(i64 x 7) with the parameters of GemmArgs:
    C[r, 0:16] = sum over k < K of A[r * lda + k] * B[k * ldb + 0:16]
    for r < mr; A, B, C addresses of float32 arrays, strides in floats, K >= 1.
    MR rows: two 8-float vectors a row; more: one 16-float vector (an AVX-512 register)."""
    lanes = 8 if mr == MR else 16
    vec = f"<{lanes} x float>"
    halves = NR // lanes
    lines: list[str] = [f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})"]
    e = lines.append
    e(SIGNATURE.define(kernel_name(mr)))
    e("entry:")
    for p in SIGNATURE.addresses:
        e(f"  %{p}p = inttoptr i64 %{p} to ptr")
    for r in range(mr):
        e(f"  %aoff{r} = mul i64 %lda, {r}")
        e(f"  %arow{r} = getelementptr float, ptr %Ap, i64 %aoff{r}")
    e("  br label %loop")
    e("loop:")
    e("  %k = phi i64 [ 0, %entry ], [ %kn, %loop ]")
    for r in range(mr):
        for h in range(halves):
            e(f"  %acc{r}_{h} = phi {vec} [ zeroinitializer, %entry ], [ %accn{r}_{h}, %loop ]")
    e("  %boff = mul i64 %k, %ldb")
    e("  %brow = getelementptr float, ptr %Bp, i64 %boff")
    for h in range(halves):
        e(f"  %b{h}p = getelementptr float, ptr %brow, i64 {lanes * h}")
        e(f"  %b{h} = load {vec}, ptr %b{h}p, align 4")
    for r in range(mr):
        e(f"  %ap{r} = getelementptr float, ptr %arow{r}, i64 %k")
        e(f"  %a{r} = load float, ptr %ap{r}, align 4")
        e(f"  %ai{r} = insertelement {vec} poison, float %a{r}, i64 0")
        e(f"  %as{r} = shufflevector {vec} %ai{r}, {vec} poison, <{lanes} x i32> zeroinitializer")
        for h in range(halves):
            e(f"  %accn{r}_{h} = call {vec} @llvm.fma.v{lanes}f32({vec} %as{r}, {vec} %b{h}, {vec} %acc{r}_{h})")
    e("  %kn = add i64 %k, 1")
    e("  %more = icmp ult i64 %kn, %K")
    e("  br i1 %more, label %loop, label %exit")
    e("exit:")
    for r in range(mr):
        e(f"  %coff{r} = mul i64 %ldc, {r}")
        for h in range(halves):
            e(f"  %coff{r}_{h} = add i64 %coff{r}, {lanes * h}")
            e(f"  %cp{r}_{h} = getelementptr float, ptr %Cp, i64 %coff{r}_{h}")
            e(f"  store {vec} %accn{r}_{h}, ptr %cp{r}_{h}, align 4")
    e("  ret void")
    e("}")
    return "\n".join(lines)


@functools.cache
def address(mr: int = MR) -> int | None:
    """Machine-code address of the mr x 16 kernel, or None where llvmlite cannot compile."""
    try:
        return llvm_host.compile_for_host(kernel_ir(mr), [kernel_name(mr)])[kernel_name(mr)]
    except (ImportError, RuntimeError, OSError):
        return None


def compiled_address(mr: int = MR) -> int:
    """address(mr), where the device runs: registry.cpu_fast_problem refuses a host without it first."""
    addr = address(mr)
    if addr is None:
        raise RuntimeError("the f32 GEMM kernel did not compile for this CPU")
    return addr


@functools.cache
def prefill_rows() -> int:
    """Rows of the kernel prefill's chunk attention calls: WIDE_MR where the host has AVX-512
    (without it, 16 rows of 16 floats would not fit the 16 vector registers) and it compiles."""
    if "+avx512f" in llvm_host.host_features().split(",") and address(WIDE_MR) is not None:
        return WIDE_MR
    return MR
