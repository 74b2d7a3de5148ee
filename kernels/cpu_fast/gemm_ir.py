"""A float32 matrix-product micro-kernel written in LLVM IR and compiled by llvmlite.

numba vectorizes elementwise loops well but not the register-blocked inner loop of a
matrix product, and attention's two products (scores = Q K^T, out = P V) otherwise
need BLAS, whose worker threads fight numba's for the cores in a round that uses both.
This kernel computes one MR x 16 block of C with broadcast-fma: per k, two 8-float
loads of B and MR broadcasts of A feed 2 * MR fmas into accumulators that stay in
registers. It needs nothing but LLVM's generic vector IR, so it compiles for any host
llvmlite supports.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from zinfer.kernels.cpu_fast import llvm_host
from zinfer.kernels.cpu_fast.kernel_signature import KernelSignature

MR = 4  # rows of C per call
NR = 16  # columns of C per call (two 8-float vectors)


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
_F8 = "<8 x float>"


def kernel_ir(mr: int = MR) -> str:
    """IR of void(i64 x 7) with the parameters of GemmArgs:
    C[r, 0:16] = sum over k < K of A[r * lda + k] * B[k * ldb + 0:16]
    for r < mr; A, B, C addresses of float32 arrays, strides in floats, K >= 1."""
    lines: list[str] = ["declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)"]
    e = lines.append
    e(SIGNATURE.define(f"sgemm_{mr}x16"))
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
        for h in range(2):
            e(f"  %acc{r}_{h} = phi {_F8} [ zeroinitializer, %entry ], [ %accn{r}_{h}, %loop ]")
    e("  %boff = mul i64 %k, %ldb")
    e("  %b0p = getelementptr float, ptr %Bp, i64 %boff")
    e("  %b1p = getelementptr float, ptr %b0p, i64 8")
    e(f"  %b0 = load {_F8}, ptr %b0p, align 4")
    e(f"  %b1 = load {_F8}, ptr %b1p, align 4")
    for r in range(mr):
        e(f"  %ap{r} = getelementptr float, ptr %arow{r}, i64 %k")
        e(f"  %a{r} = load float, ptr %ap{r}, align 4")
        e(f"  %ai{r} = insertelement {_F8} poison, float %a{r}, i64 0")
        e(f"  %as{r} = shufflevector {_F8} %ai{r}, {_F8} poison, <8 x i32> zeroinitializer")
        for h in range(2):
            e(f"  %accn{r}_{h} = call {_F8} @llvm.fma.v8f32({_F8} %as{r}, {_F8} %b{h}, {_F8} %acc{r}_{h})")
    e("  %kn = add i64 %k, 1")
    e("  %more = icmp ult i64 %kn, %K")
    e("  br i1 %more, label %loop, label %exit")
    e("exit:")
    for r in range(mr):
        e(f"  %coff{r} = mul i64 %ldc, {r}")
        for h in range(2):
            e(f"  %coff{r}_{h} = add i64 %coff{r}, {8 * h}")
            e(f"  %cp{r}_{h} = getelementptr float, ptr %Cp, i64 %coff{r}_{h}")
            e(f"  store {_F8} %accn{r}_{h}, ptr %cp{r}_{h}, align 4")
    e("  ret void")
    e("}")
    return "\n".join(lines)


@functools.cache
def address() -> int | None:
    """Machine-code address of the MR x 16 kernel, or None where llvmlite cannot compile."""
    try:
        return llvm_host.compile_for_host(kernel_ir(), [f"sgemm_{MR}x16"])[f"sgemm_{MR}x16"]
    except (ImportError, RuntimeError, OSError):
        return None


def compiled_address() -> int:
    """address(), where the device runs: registry.cpu_fast_problem refuses a host without it first."""
    addr = address()
    if addr is None:
        raise RuntimeError("the f32 GEMM kernel did not compile for this CPU")
    return addr
