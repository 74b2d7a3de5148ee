"""llama.cpp's repacked weight products (ggml-cpu/repack.cpp), reproduced in numpy.

By default (llama_model_params.use_extra_bufts) llama.cpp moves the weights its
CPU_REPACK buffer type can take into interleaved layouts at load and multiplies them by
their own kernels. It takes a 2-D weight of a MUL_MAT with float32 activations (so not
token_embd, read by GET_ROWS, nor an output head tied to it) when
ggml_repack_get_optimal_repack_type finds a layout; on an x86 host with AVX2 that is
Q4_0, Q4_K, IQ4_NL and MXFP4 with a multiple of 8 rows, and Q2_K where the CPU also has
AVX-512 (REPACKED). Every other type keeps the plain kernels (llama_numerics.py).

Q4_K (block_q4_Kx8 with Q8_K activations, AVX2/AVX-512 bodies in arch/x86/repack.cpp)
is reproduced exactly (EXACT):

- forward_mul_mat rounds the activation rows in groups of four
  (ggml_quantize_mat_q8_K_4x8) and multiplies them by ggml_gemm_q4_K_8x8_q8_K; the last
  T % 4 rows are rounded by quantize_row_q8_K and multiplied by ggml_gemv_q4_K_8x8_q8_K.
  The two roundings differ only in the sign of the scale when +max|x| and -max|x| both
  occur in a block.
- Both kernels sum exact integers, then accumulate one float per output in two fused
  multiply-adds: acc = fma(float(sum of scale * q * a), d_w * d_a, acc) and
  acc_min = fma(float(sum of min * activation sums), dmin_w * d_a, acc_min); the gemv
  once per 256-element block, the gemm once per 64 elements (two sub-blocks). The
  result is acc - acc_min.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.llama_cpp.llama_numerics import Activations, LlamaMatrix, decompose, fma_chain, quantize_activations

REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4", "Q2_K"}  # the types llama.cpp repacks on an AVX-512 host
EXACT = {"Q4_K"}  # the repacked types whose kernels are reproduced here
GEMM_ROWS = 4  # activation rows per gemm group
CHUNK = 64  # elements per integer sum of the gemm (the gemv adds four)
_CHUNK = 1 << 22  # integer chunk sums held at once (float32 elements)


def repacks(kind: str, shape: tuple[int, ...]) -> bool:
    """Whether llama.cpp (x86, AVX2 + AVX-512) repacks a MUL_MAT weight of type `kind`
    and shape [out, in]: a type with an interleaved layout and out % 8 == 0."""
    return len(shape) == 2 and kind in REPACKED and shape[0] % 8 == 0


def split_weight(data: np.ndarray, qtype: QT | int, shape: tuple[int, int]) -> LlamaMatrix:
    """A Q4_K [out, n] weight for matmul: codes [n / 64, 64, out] float32 (scale * q, at
    most 945, so every 64-element sum of products with int8 activations is exact)."""
    kind, codes, d, m, sub = decompose(data, qtype, shape)
    assert kind in EXACT, kind
    out, n = shape
    chunks = np.ascontiguousarray(codes.reshape(out, n // CHUNK, CHUNK).transpose(1, 2, 0), np.float32)
    return LlamaMatrix(kind, chunks, d, m, sub)


def matmul(x: np.ndarray, w: LlamaMatrix) -> np.ndarray:
    """x [T, n] float32 times the repacked Q4_K w^T: [T, out] float32, as llama.cpp's
    repacked kernels compute it (gemm for the first T - T % 4 rows, gemv for the rest)."""
    assert w.kind in EXACT, w.kind
    x = np.ascontiguousarray(x, dtype=np.float32)
    T = x.shape[0]
    g = T - T % GEMM_ROWS
    out = np.empty((T, w.codes.shape[-1]), np.float32)
    if g:
        out[:g] = _product(quantize_activations(x[:g], "Q8_K", interleaved=True), w, per=64)
    if g < T:
        out[g:] = _product(quantize_activations(x[g:], "Q8_K"), w, per=256)
    return out


def _product(act: Activations, w: LlamaMatrix, per: int) -> np.ndarray:
    """[T, out]: one pair of fused multiply-adds per `per` elements of every output."""
    T, n = act.codes.shape
    n_out = w.codes.shape[-1]
    out = np.empty((T, n_out), np.float32)
    step = max(1, _CHUNK // (T * (n // CHUNK)))
    for o0 in range(0, n_out, step):
        out[:, o0 : o0 + step] = _rows(act, w, slice(o0, o0 + step), per)
    return out


def _rows(act: Activations, w: LlamaMatrix, rows: slice, per: int) -> np.ndarray:
    """Outputs [T, len(rows)] for a slice of weight rows."""
    T, n = act.codes.shape
    c = w.codes[..., rows]  # [n / 64, 64, O]: scale * q
    O = c.shape[-1]
    chunks, subs = n // per, per // 32  # chunks per row, 32-element sub-blocks per chunk
    a = act.codes.reshape(T, n // CHUNK, CHUNK).transpose(1, 0, 2).astype(np.float32)  # [n / 64, T, 64]
    dots = a @ c  # [n / 64, T, O]: exact integers
    assert act.s is not None and w.m is not None and w.sub is not None  # Q8_K's sums, Q4_K's dmin and minima
    if per != CHUNK:  # sums of 256, exact in float64, then cvtepi32_ps
        dots = dots.astype(np.float64).reshape(chunks, per // CHUNK, T, O).sum(1).astype(np.float32)
    sums32 = act.s.reshape(T, chunks, subs, 2).sum(-1)  # [T, chunks, subs]: activation sums of 32
    mins = w.sub[rows].reshape(O, chunks, subs)  # [O, chunks, subs]: 6-bit sub-block minima
    msum = np.einsum("tcs,ocs->cto", sums32, mins).astype(np.float32)  # [chunks, T, O]
    dd = act.d.T[:, :, None] * w.d[rows].T[:, None, :]  # [blocks, T, O] float32: d_a * d_w
    dm = act.d.T[:, :, None] * w.m[rows].T[:, None, :]  # [blocks, T, O] float32: d_a * dmin_w
    per_block = 256 // per
    acc = fma_chain(dots, np.repeat(dd, per_block, axis=0))
    acc_min = fma_chain(msum, np.repeat(dm, per_block, axis=0))
    out: np.ndarray = acc - acc_min
    return out
