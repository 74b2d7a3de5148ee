"""llama.cpp's CPU arithmetic for quantized matrix products, reproduced in numpy.

ggml never multiplies a quantized weight by float activations. It first rounds each row
of activations to int8 blocks of its "vec_dot_type" (Q8_0, Q8_1 or Q8_K), then its AVX2
kernels (ggml_vec_dot_*, and llamafile's tinyBLAS for Q8_0/Q5_0) compute, per block:

- exact integer products, summed in 8 int32 lanes: lane L takes the elements i with
  (i % 32) // 4 == L, with K-quant sub-block scales folded in;
- one fused multiply-add per lane and block: acc[L] = fma(d_w * d_a, float(lane), acc[L]);
- at the end a fixed horizontal sum of the 8 lanes, plus the block-minimum term of
  Q4_1 (a scalar sum of m * s) or Q4_K (4 lanes of dmin * mins . bsums). Q6_K multiplies
  its unsigned 6-bit codes and takes 32 * scales . bsums off each lane afterwards.

From 8 activation rows up, llama.cpp multiplies K-quants by its tiled kernels
(ggml_compute_forward_mul_mat_tiled, AVX512-VNNI): per output and 256-block one exact
integer dot with the sub-block scales, s1 (and for Q4_K one of the sub-block minima with
the activation sums, s2), then r = float(s1) * d_w, r = fma(-dmin, float(s2), r) and
acc = fma(r, d_a, acc) (BATCHED).

Reproducing that order makes our products bit-equal to llama.cpp's (checked tensor by
tensor against llama-cpp-python 0.3.36 with weight repacking off, use_extra_bufts=False:
Q4_1, Q8_0, Q5_0, Q4_K, Q6_K), so greedy decoding takes the same near-ties.
Other weight types fall back to float products of their dequantized values with
rounded activations.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit

from zinfer.kernels.llama_cpp.llama_ops import fma
from zinfer.kernels.oracle.block_fields import k4_scales_mins
from zinfer.kernels.oracle.quants import BLOCK_SHAPES, dequantize, qtype_of

# weight types reproduced exactly -> (byte offset of d, byte offset of m/dmin or None)
EXACT = {
    "Q5_0": (0, None),
    "Q8_0": (0, None),
    "Q4_1": (0, 2),
    "Q4_K": (0, 2),
    "Q6_K": (208, None),
}
# every weight type's "vec_dot_type": how ggml rounds the activations it multiplies
ACTIVATION_TYPE = {
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
    "F16": "F16", "BF16": "BF16",
}
_F16_ONE = np.float16(1.0).view(np.uint16)
_LANES = 8
BATCHED = {"Q4_K": 8, "Q6_K": 8}  # weight type -> activation rows from which ggml switches kernels
_CHUNK = 1 << 22  # lane partial sums held at once (float64 elements)


class LlamaMatrix(NamedTuple):
    """A quantized weight as ggml's integer kernels see it."""

    kind: str  # weight type, a key of EXACT
    codes: np.ndarray  # [blocks, 8, n/blocks/8, out]: integer codes (K-quant sub-block scales folded in), lane by lane
    d: np.ndarray  # [out, blocks] float32 block scales
    m: np.ndarray | None  # Q4_1: [out, blocks] float32 minima; Q4_K: [out, blocks] dmin
    sub: np.ndarray | None  # Q4_K: [out, blocks, 8] 6-bit sub-block minima; Q6_K: [out, blocks, 16] int8 scales


def _f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    return blocks[:, offset : offset + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def split_weight(data: np.ndarray, qtype: QT | int, shape: tuple[int, int]) -> LlamaMatrix:
    """Decompose a quantized [out, n] weight into integer codes and float block scales, the
    codes in the lanes of ggml's vec_dot kernels: element i of a block in lane (i % 32) // 4,
    float32 where every lane's sum of products with int8 activations is exact in float32
    (below 2^24), else float64, so that one BLAS product per lane and block is exact."""
    kind, codes, d, m, sub = decompose(data, qtype, shape)
    out, n = shape
    blocks = d.shape[1]
    per = n // blocks // 32  # 32-element groups per block
    by_lane = codes.reshape(out, blocks, per, _LANES, 4).transpose(1, 3, 2, 4, 0)
    lanes = by_lane.reshape(blocks, _LANES, per * 4, out)
    exact32 = int(np.abs(codes).max(initial=0)) * 127 * per * 4 < 1 << 24
    return LlamaMatrix(kind, np.ascontiguousarray(lanes, np.float32 if exact32 else np.float64), d, m, sub)


def decompose(
    data: np.ndarray, qtype: QT | int, shape: tuple[int, int]
) -> tuple[str, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A quantized [out, n] weight as (type name, integer codes [out, n] int16 with K-quant
    sub-block scales folded in, d, m, sub as in LlamaMatrix)."""
    qt = qtype_of(qtype)
    d_at, m_at = EXACT[qt.name]
    epb, bpb = BLOCK_SHAPES[qt]
    out, n = shape
    blocks = np.ascontiguousarray(data).reshape(-1).view(np.uint8).reshape(-1, bpb)
    d = _f16_at(blocks, d_at).reshape(out, n // epb)
    unit = blocks.copy()  # d := 1 and m := 0, so dequantizing yields the integer codes
    unit[:, d_at : d_at + 2] = np.frombuffer(_F16_ONE.tobytes(), np.uint8)
    m = sub = None
    if m_at is not None:
        m = _f16_at(blocks, m_at).reshape(out, n // epb)
        unit[:, m_at : m_at + 2] = 0
    codes = dequantize(unit, qt, shape).astype(np.float64)
    if qt.name == "Q4_K":
        sub = k4_scales_mins(blocks[:, 4:16])[1].astype(np.float64).reshape(out, n // epb, 8)
    elif qt.name == "Q6_K":  # codes scale * (q - 32) -> scale * q; the 32 comes back through bsums
        sub = blocks[:, 192:208].view(np.int8).astype(np.float64).reshape(out, n // epb, 16)
        codes += 32 * np.repeat(sub.reshape(out, -1), 16, axis=1)
    return qt.name, codes.astype(np.int16), d, m, sub


class Activations(NamedTuple):
    """A row block of activations rounded as ggml's quantize_row_q8_* rounds them."""

    codes: np.ndarray  # [T, n] float64 int8 codes
    d: np.ndarray  # [T, blocks] float32 scales (fp16-rounded for Q8_0/Q8_1)
    s: np.ndarray | None  # Q8_1: [T, blocks] float32, fp16(d * sum(codes)); Q8_K: [T, blocks, 16] sums of 16


def quantize_activations(x: np.ndarray, kind: str, interleaved: bool = False) -> Activations:
    """x [T, n] float32 as ggml rounds it for a product with a weight of `kind`'s activation type.
    interleaved (Q8_K): as ggml_quantize_mat_q8_K_4x8 rounds rows for the repacked gemm,
    whose scale is negative where any value equals +max|x| (quantize_row_q8_K takes the
    sign of the first value of largest magnitude)."""
    block = 256 if kind == "Q8_K" else 32
    T, n = x.shape
    xb = x.reshape(T, n // block, block)  # [T, blocks, block]
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "Q8_K" and interleaved:
            amax = np.max(np.abs(xb), axis=-1, keepdims=True)
            maxv = np.where(np.any(xb == amax, axis=-1, keepdims=True), amax, -amax)
        elif kind == "Q8_K":  # quantize_row_q8_K_ref: scale from the signed value of largest magnitude
            idx = np.argmax(np.abs(xb), axis=-1)[..., None]
            maxv = np.take_along_axis(xb, idx, axis=-1)
        if kind == "Q8_K":
            iscale = np.where(maxv != 0, np.float32(-127.0) / maxv, np.float32(0.0)).astype(np.float32)
            q = np.minimum(np.rint(iscale * xb), 127)
            d = np.where(iscale != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)[..., 0]
            s = q.reshape(T, n // block, 16, 16).sum(-1)
        else:  # quantize_row_q8_0 / q8_1 (AVX2): d = amax / 127 stored as fp16, codes = rint(x * 127 / amax)
            amax = np.max(np.abs(xb), axis=-1, keepdims=True)
            inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
            q = np.rint(xb * inv)
            d32 = (amax / np.float32(127.0))[..., 0]
            d = d32.astype(np.float16).astype(np.float32)
            s = (d32 * q.sum(-1, dtype=np.float32)).astype(np.float16).astype(np.float32) if kind == "Q8_1" else None
    return Activations(q.reshape(T, n).astype(np.float64), d, s)


def round_activations(x: np.ndarray, kind: str | None) -> np.ndarray:
    """x [T, n] float32 rounded as ggml rounds activations of `kind` (Q8_0/Q8_1/Q8_K/F16/BF16),
    as float32 values [T, n]; None: x unchanged."""
    if kind is None:
        return x
    if kind == "F16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "BF16":
        bits = x.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return rounded.astype(np.uint32).view(np.float32)
    act = quantize_activations(np.ascontiguousarray(x, dtype=np.float32), kind)
    T, n = x.shape
    blocks = act.d.shape[1]
    values: np.ndarray = (act.codes.reshape(T, blocks, n // blocks) * act.d[..., None]).astype(np.float32)
    return values.reshape(T, n)


@njit(nogil=True)
def _chain(a: np.ndarray, c: np.ndarray, acc: np.ndarray) -> None:
    """The compiled loop of fma_chain (no fastmath: the same IEEE operations as llama_ops.fma):
    a, c [B, N] float32; acc [N] float32, updated."""
    for b in range(a.shape[0]):
        for i in range(a.shape[1]):
            acc[i] = np.float32(np.float64(a[b, i]) * np.float64(c[b, i]) + np.float64(acc[i]))


def fma_chain(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """acc = fma(a[b], c[b], acc) for b in order from acc = 0 (llama_ops.fma's rounding):
    a, c [B, ...] broadcastable float32 -> [...] float32. One compiled pass instead of
    B numpy ones."""
    shape = np.broadcast_shapes(a.shape, c.shape)
    a2, c2 = (np.ascontiguousarray(np.broadcast_to(v, shape), np.float32).reshape(shape[0], -1) for v in (a, c))
    acc = np.zeros(a2.shape[1], np.float32)
    _chain(a2, c2, acc)
    return acc.reshape(shape[1:])


def _hsum8(acc: np.ndarray) -> np.ndarray:
    """ggml's hsum_float_8 over the leading axis of acc [8, ...] float32."""
    r = acc[4:] + acc[:4]
    total: np.ndarray = (r[0] + r[2]) + (r[1] + r[3])
    return total


def matmul(x: np.ndarray, w: LlamaMatrix) -> np.ndarray:
    """x [T, n] float32 times w^T: [T, out] float32, as llama.cpp's CPU backend computes it."""
    act = quantize_activations(np.ascontiguousarray(x, dtype=np.float32), ACTIVATION_TYPE[w.kind])
    n_out = w.codes.shape[-1]
    out = np.empty((x.shape[0], n_out), np.float32)
    T, n = x.shape
    blocks = w.d.shape[1]
    step = max(1, _CHUNK * 32 // (T * n))
    for o0 in range(0, n_out, step):
        out[:, o0 : o0 + step] = _rows(act, w, slice(o0, o0 + step), blocks)
    return out


def matmul_rounded(x: np.ndarray, w: np.ndarray, kind: str) -> np.ndarray:
    """x [T, n] with ggml's int8 rounding for weight type `kind`, times the dequantized
    w [out, n] by one float32 BLAS product: [T, out]. The products differ from
    llama.cpp's only by summation order (for the LM head, where that order feeds no
    further rounding and the exact kernel would cost seconds per token)."""
    product: np.ndarray = round_activations(x, ACTIVATION_TYPE[kind]) @ w.T
    return product


def _rows(act: Activations, w: LlamaMatrix, rows: slice, blocks: int) -> np.ndarray:
    """Outputs [T, len(rows)] for a slice of weight rows."""
    T, n = act.codes.shape
    c = w.codes[..., rows]  # [blocks, 8, per * 4, O]
    O = c.shape[-1]
    per = n // blocks // 32  # 32-element groups per block
    by_lane = act.codes.reshape(T, blocks, per, _LANES, 4).transpose(1, 3, 0, 2, 4)
    a = by_lane.reshape(blocks, _LANES, T, per * 4).astype(c.dtype)
    lanes = a @ c  # [blocks, 8, T, O]: exact integers
    if T >= BATCHED.get(w.kind, T + 1):
        return _rows_batched(act, w, rows, lanes.astype(np.float64))
    if w.kind == "Q6_K":  # lane L -= 32 * (scale . bsums) over 16-element sub-blocks 2L, 2L+1
        assert act.s is not None and w.sub is not None  # Q8_K's sums, Q6_K's scales
        corr = np.einsum("tbk,obk->btok", act.s, w.sub[rows]).reshape(blocks, T, O, _LANES, 2).sum(-1)
        lanes = lanes.astype(np.float64) - 32 * corr.transpose(0, 3, 1, 2)
    lanes = lanes.astype(np.float32)  # cvtepi32_ps
    dd = act.d.T[:, :, None] * w.d[rows].T[:, None, :]  # [blocks, T, O] float32
    total = _hsum8(fma_chain(dd[:, None], lanes))  # 8 lane accumulators [8, T, O]
    if w.kind == "Q4_1":  # summs += m * s, block by block
        assert act.s is not None and w.m is not None  # Q8_1's sums, Q4_1's minima
        summs = np.zeros((T, O), np.float32)
        ms = act.s.T[:, :, None] * w.m[rows].T[:, None, :]  # [blocks, T, O]
        for b in range(blocks):
            summs = summs + ms[b]
        total = total + summs
    elif w.kind == "Q4_K":  # 4 lanes of dmin * (mins . sums of 32), pairs of sub-blocks
        assert act.s is not None and w.m is not None and w.sub is not None  # Q8_K's sums, Q4_K's dmin and minima
        sums32 = act.s.reshape(T, blocks, 8, 2).sum(-1)
        prod = np.einsum("tbk,obk->btok", sums32, w.sub[rows]).reshape(blocks, T, O, 4, 2).sum(-1)
        dmin = -act.d.T[:, :, None] * w.m[rows].T[:, None, :]  # [blocks, T, O]
        acc_m = fma_chain(dmin[..., None], prod.astype(np.float32))  # [T, O, 4]
        total = total + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))
    return total


def _rows_batched(act: Activations, w: LlamaMatrix, rows: slice, lanes: np.ndarray) -> np.ndarray:
    """K-quants from 8 rows up (ggml's tiled kernels): one accumulator per output, per block
    r = float(s1) * d_w (less dmin * float(s2) for Q4_K), acc = fma(r, d_a, acc).
    lanes [blocks, 8, T, O] float64: the exact lane sums of the block products."""
    T = act.codes.shape[0]
    blocks = lanes.shape[0]
    s1 = lanes.sum(axis=1)  # [blocks, T, O]: exact
    if w.kind == "Q6_K":  # scale * (q - 32): the 32 through the sums of 16
        assert act.s is not None and w.sub is not None
        s1 -= 32 * np.einsum("tbk,obk->bto", act.s, w.sub[rows])
    r = s1.astype(np.float32) * w.d[rows].T[:, None, :]  # [blocks, T, O]: float(s1) * d_w
    if w.kind == "Q4_K":  # s2 = mins . sums of 32 activations, exact
        assert act.s is not None and w.m is not None and w.sub is not None
        sums32 = act.s.reshape(T, blocks, 8, 2).sum(-1)
        s2 = np.einsum("tbk,obk->bto", sums32, w.sub[rows]).astype(np.float32)
        r = fma(-w.m[rows].T[:, None, :], s2, r)
    return fma_chain(r, act.d.T[:, :, None])
