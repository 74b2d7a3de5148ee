"""cpu-fast's weight matrices, each carrying the kernel chosen for it at upload.

`linear_for` picks once per matrix, from its type and the device's options:

- Int8Linear: a packed type with an int8 kernel (VNNI or AVX2) (kernels/cpu_fast/int8/products.py), where the
  CPU has one; on an AMX-INT8 CPU it carries the AMX tile layout too (8 bits a weight, beside the int8 view),
  which rounds of many rows multiply on the tiles (ZINFER_INT8_KERNELS=vnni|avx2|amx forces a path).
  Activations rounded to int8 per 32 values (K-quants per 256), as llama.cpp
  does; even at 512 rows this beats BLAS on f32 copies, so no copy is kept.
  The device groups these by activation layout (one rounding of x, one launch). They
  keep only the int8 kernels' layout (no packed blocks next to it): Q5_0 and Q6_K at
  the file's width, Q8_0 and Q4_1 too, Q4_0 and Q4_K at 5 and 6 bits per weight.
- QuantLinear: a packed type without int8 kernels (neither VNNI nor AVX2, int8 off, or a shape the
  int8 kernels do not take). Its kernel switches by batch size, the one place it does:
  up to `small_rows` rows the float quantized kernel (kernels/cpu_fast/cpu_quant.py), streaming
  ~1/6 of the bytes of an f32 matrix; above, BLAS on an f32 copy kept at upload (while
  copies fit the device's f32 budget) or, without one, on tiles of rows dequantized on
  the fly (the crossovers: SMALL_BATCH, SMALL_BATCH_NO_COPY).
- F32Linear: F32/F16/BF16 matrices and types with no packed kernel, as f32, through BLAS.

Every class keeps `shape`, `packed` and `f32`; `dequantize_rows` reads rows from whichever
it holds (the device's embed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.oracle.quants import dequantize

SMALL_BATCH = 4  # rows up to which the float quantized kernel beats BLAS on an f32 copy
SMALL_BATCH_NO_COPY = 12  # the same crossover when BLAS must dequantize tiles first
_TILE_ROWS = 2048  # weight rows dequantized per BLAS tile when no f32 copy is kept
PACKED_TYPES = cq.U4_TYPES + cq.I8_TYPES


@dataclass
class FastWeight:
    """A resident matrix [rows, cols]: packed blocks, the int8 kernels' view and/or an f32 copy (at least one)."""

    shape: tuple[int, int]
    packed: cq.Packed | None
    f32: np.ndarray | None  # [rows, cols]
    int8: ci.Int8Weight | None = None  # the packed blocks as the int8 kernels read them

    @property
    def nbytes(self) -> int:
        """The resident bytes: every array held (the int8 view's where it is not packed's own;
        not u4's few pad rows)."""
        arrays: list[object] = [*(self.packed or ()), self.f32]
        if self.int8 is not None:
            w8 = self.int8
            arrays += [w8.qs, w8.d, w8.m[: self.shape[0]] if w8.kind == "u4" else w8.m]
            if w8.amx is not None:
                arrays += list(w8.amx.arrays)
        unique = {id(a): a for a in arrays if isinstance(a, np.ndarray)}
        return sum(a.nbytes for a in unique.values())

    def dequantize_rows(self, rows: np.ndarray, out: np.ndarray) -> None:
        """out [n, cols] = the f32 values of rows [n] int64, from whichever form is held."""
        if self.f32 is not None:
            out[:] = self.f32[rows]
        elif self.packed is not None:
            cq.dequantize_rows(self.packed, rows, out)
        else:
            assert self.int8 is not None  # a FastWeight holds at least one form
            ci.dequantize_rows(self.int8, rows, out)

    def compute(self, x: np.ndarray) -> np.ndarray:
        """x [T, cols] float32 contiguous @ self.T -> a new [T, rows] array."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")


class F32Linear(FastWeight):
    """An f32 matrix (packed is None): BLAS at every batch size."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        assert self.f32 is not None  # an F32Linear holds its f32
        out: np.ndarray = x @ self.f32.T  # [T, rows]
        return out


class QuantLinear(FastWeight):
    """Packed blocks, and an f32 copy or None: the float quantized kernel for up to
    `small_rows` rows, BLAS (on the copy, else on tiles dequantized per call) above."""

    @property
    def small_rows(self) -> int:
        return SMALL_BATCH if self.f32 is not None else SMALL_BATCH_NO_COPY

    def compute(self, x: np.ndarray) -> np.ndarray:
        assert self.packed is not None  # a QuantLinear holds its packed blocks
        T, (rows, cols) = x.shape[0], self.shape
        if T <= self.small_rows:
            out = np.empty((T, rows), np.float32)  # [T, rows]
            cq.matmul(self.packed, x, out)
            return out
        if self.f32 is not None:
            product: np.ndarray = x @ self.f32.T  # [T, rows]
            return product
        out = np.empty((T, rows), np.float32)
        tile = np.empty((min(_TILE_ROWS, rows), cols), np.float32)  # [tile, cols]
        for a in range(0, rows, _TILE_ROWS):
            idx = np.arange(a, min(a + _TILE_ROWS, rows), dtype=np.int64)
            cq.dequantize_rows(self.packed, idx, tile[: len(idx)])
            np.matmul(x, tile[: len(idx)].T, out=out[:, a : a + len(idx)])
        return out


class Int8Linear(FastWeight):
    """The int8 kernels' view alone (packed is None): the int8 kernels at every batch size.
    The device computes these in groups (one rounding of x per layout); this is one alone."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        assert self.int8 is not None  # an Int8Linear holds its int8 view
        out = np.empty((x.shape[0], self.shape[0]), np.float32)  # [T, rows]
        ci.matmul(self.int8, x, out)
        return out


class F32Budget:
    """Bytes still allowed for f32 copies of quantized matrices; `take` spends them."""

    def __init__(self, nbytes: int) -> None:
        self.left = nbytes

    def take(self, nbytes: int) -> bool:
        """Spend nbytes if they fit; whether they did."""
        if nbytes > self.left:
            return False
        self.left -= nbytes
        return True


def linear_for(qt: QT, data: np.ndarray, shape: tuple[int, int], int8: bool, budget: F32Budget) -> FastWeight:
    """The weight of type qt, raw GGUF bytes `data` and shape [rows, cols] with its kernel:
    Int8Linear when int8 (the host runs the int8 kernels) and the type and shape have one,
    else QuantLinear for a packed type (spending `budget` on an f32 copy where it fits),
    else F32Linear. Raises what kernels.oracle.quants.dequantize raises for a type it cannot read."""
    if qt not in PACKED_TYPES:
        return F32Linear(shape, None, _f32(data, qt, shape))
    own_width = ci.from_gguf(qt, data, shape) if int8 else None
    if own_width is not None:
        return Int8Linear(shape, None, None, ci.with_tiles(own_width, qt, data, shape))
    packed = cq.repack(qt, data, shape)
    int8_view = ci.prepare(packed) if int8 else None
    if int8_view is not None:  # the view alone: its scales (f16) or codes (p8) are copies
        return Int8Linear(shape, None, None, ci.with_tiles(int8_view, qt, data, shape))
    copy = _f32(data, qt, shape) if budget.take(shape[0] * shape[1] * 4) else None
    return QuantLinear(shape, packed, copy)


def _f32(data: np.ndarray, qt: QT, shape: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(dequantize(data, qt, shape), dtype=np.float32)
