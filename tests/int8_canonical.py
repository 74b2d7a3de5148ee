"""The one float order of every int8 product path, in numpy: the reference that the row
kernels (ir.py, ir_blocks.py, ir_super.py), the outer products (ir_outer.py) and the AMX
tiles (amx_ir.py) must each equal bit for bit, so that a row's result never depends on
which path its round took (its batch, its prefix-cache hits, the CPU's tiles).

Integers are exact in every path; only the float steps are ordered. The activations are the
kernels' own: codes a = rint(x * 127 / amax) and d_a = amax / 127 per rounding group (32
columns, 256 for the K-quants), with each 32-block's code sum. Per output (t, row):

- Blocks of 32 (Q4_0, Q4_1 as "u4"; Q8_0, and Q5_0 off 128 columns, as "p8"; Q5_0 at
  cols % 128 == 0 as "u5"): with I_b = the block's exact integer sum of codes times
  activations (signed codes; u4's unsigned 0..15) and C classes (u4 and p8: 2, u5: 4),
  block b in column order updates its class's sum
      acc[b % C] = fma(f32(I_b), d_b * d_a_b, acc[b % C])
      acc[b % C] = fma(m_b, N_b, acc[b % C])        (u4 only: N_b = d_a_b * f32(code sum))
  and out = (((acc[0] + acc[1]) + acc[2]) + acc[3]) (left to right over the C classes).
- Super-blocks of 256 (Q4_K as "k4", Q6_K as "u6"), one chain over super-blocks s:
      I_s = sum over sub-blocks j of scale_j * I_j      (exact int32; Q6_K: 16-column j, signed codes)
      acc = fma(f32(I_s), d_s * d_a_s, acc)
      acc = fma(f32(M_s), (-dmin_s) * d_a_s, acc)     (k4 only: M_s = sum of min_j * code sum_j)
  and out = acc.

Every product `p * q` above is one f32 multiply (rounded once); fma rounds once; d_b, m_b,
d_s, dmin_s are the file's scales as f32 (exact). The classes exist so that the row kernels,
whose 8 int32 lanes hold parts of C blocks a step, keep one vector fma a step.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.oracle.block_fields import f16, k4_scales_mins

F32, F64 = np.float32, np.float64


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The f32 fused multiply-add a * b + c rounded once (arrays of f32, broadcast), exact:
    a * b is exact in f64, the f64 sum's error is recovered (TwoSum), and the one case where
    rounding f64 to f32 rounds twice (the f64 sum exactly halfway between two f32) is mended."""
    a64, b64, c64 = (np.asarray(v, F32).astype(F64) for v in (a, b, c))
    p = a64 * b64
    s = p + c64
    v = s - p
    err = (p - (s - v)) + (c64 - v)  # p + c == s + err exactly
    r = s.astype(F32)
    r64 = r.astype(F64)
    toward = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf)).astype(F32))
    halfway = (s != r64) & (np.abs(s - r64) * 2 == np.abs(toward.astype(F64) - r64))
    past = halfway & (err != 0) & (np.sign(err) == np.sign(s - r64))
    out: np.ndarray = np.where(past, toward, r).astype(F32)
    return out


def activations(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """x [T, cols] f32 -> (codes [T, cols] int64, d_a [T, cols / group] f32), as the kernels round."""
    T, cols = x.shape
    xb = x.reshape(T, cols // group, group)
    amax = np.abs(xb).max(axis=-1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    codes = np.rint((xb * inv[..., None]).astype(F32)).astype(np.int64).reshape(T, cols)
    return codes, d


def kind_of(qt: QT, cols: int) -> str:
    """The int8 layout whose float order a matrix of type qt and width cols follows (products.py's table)."""
    if qt == QT.Q4_K:
        return "k4"
    if qt == QT.Q6_K:
        return "u6"
    if qt == QT.Q5_0 and cols % 128 == 0:
        return "u5"
    return "u4" if qt in (QT.Q4_0, QT.Q4_1) else "p8"


CLASSES = {"u4": 2, "p8": 2, "u5": 4}


def product(qt: QT, raw: np.ndarray, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    """out [T, rows] f32 = x [T, cols] @ W.T in the module docstring's order."""
    kind = kind_of(qt, shape[1])
    if kind in ("k4", "u6"):
        return _super_blocks(qt, raw, shape, x)
    return _blocks(kind, qt, raw, shape, x)


def _blocks(kind: str, qt: QT, raw: np.ndarray, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    rows, cols = shape
    p = cq.repack(qt, raw, shape)
    if p.kind == "u4":  # codes 0..15, value = code * d + m
        u = p.qs.reshape(rows, cols // 32, 16)
        q = np.concatenate((u & 15, u >> 4), axis=-1).astype(np.int64)  # [rows, nb, 32]
    else:
        q = p.qs.astype(np.int64).reshape(rows, cols // 32, 32)
    a, d_a = activations(x, 32)
    T, nb = x.shape[0], cols // 32
    ab = a.reshape(T, nb, 32)
    ints = np.einsum("rbk,tbk->trb", q, ab).astype(F32)  # [T, rows, nb], exact below 2^24
    sums = (d_a * ab.sum(-1).astype(F32)).astype(F32)  # [T, nb]: N_b
    C = CLASSES[kind]
    acc = np.zeros((C, T, rows), F32)
    for b in range(nb):
        c = b % C
        ds = (p.d[None, :, b] * d_a[:, None, b]).astype(F32)
        acc[c] = fma32(ints[:, :, b], ds, acc[c])
        if kind == "u4":
            acc[c] = fma32(np.broadcast_to(p.m[None, :, b], (T, rows)), sums[:, None, b], acc[c])
    out = acc[0]
    for c in range(1, C):
        out = (out + acc[c]).astype(F32)
    return out


def _super_blocks(qt: QT, raw: np.ndarray, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
    rows, cols = shape
    ns = cols // 256
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    a, d_a = activations(x, 256)
    T = x.shape[0]
    if qt == QT.Q4_K:
        blocks = b.reshape(rows, ns, 144)
        d, dmin = f16(blocks[..., 0:2].reshape(-1, 2)), f16(blocks[..., 2:4].reshape(-1, 2))
        sc, mn = (v.astype(np.int64).reshape(rows, ns, 8) for v in k4_scales_mins(blocks[..., 4:16].reshape(-1, 12)))
        u = cq.repack(qt, raw, shape).qs.reshape(rows, ns, 8, 16)
        q = np.concatenate((u & 15, u >> 4), axis=-1).astype(np.int64)  # [rows, ns, 8, 32]
        ab = a.reshape(T, ns, 8, 32)
        ints = np.einsum("rsjk,tsjk->trsj", q, ab)
        I = (ints * sc[None]).sum(-1)  # [T, rows, ns]
        M = (ab.sum(-1)[:, None] * mn[None]).sum(-1)
        d, ndmin = d.reshape(rows, ns), (-dmin).reshape(rows, ns)
    else:
        blocks = b.reshape(rows, ns, 210)
        d = f16(blocks[..., 208:210].reshape(-1, 2)).reshape(rows, ns)
        sc = blocks[..., 192:208].view(np.int8).astype(np.int64)  # [rows, ns, 16]
        q = cq.repack(qt, raw, shape).qs.astype(np.int64).reshape(rows, ns, 16, 16)
        ints = np.einsum("rsjk,tsjk->trsj", q, a.reshape(T, ns, 16, 16))
        I = (ints * sc[None]).sum(-1)
        M = None
    acc = np.zeros((T, rows), F32)
    for s in range(ns):
        acc = fma32(I[:, :, s].astype(F32), (d[None, :, s] * d_a[:, None, s]).astype(F32), acc)
        if M is not None:
            acc = fma32(M[:, :, s].astype(F32), (ndmin[None, :, s] * d_a[:, None, s]).astype(F32), acc)
    return acc
