"""The numpy CPU device: the correctness oracle.

Weights are dequantized to float32 at load; KV lives in float32 numpy pools. Every op
is a kernels/oracle/reference.py call. llama.cpp's arithmetic on the same pools and
rounds is its own device, devices/cpu_llama.py; NumpyDevice is what the two share.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zinfer.devices.base import DeviceBase, Layers
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.round import RoundCtx
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.quants import dequantize
from zinfer.kernels.oracle.rope import RopeScaling
from zinfer.kernels.tensor import TensorData


@dataclass
class CpuKV:
    """Per layer K and V pools, [num_blocks * block_size, Hkv, hd] (flat slots), float32
    or, on cpu-fast by default, float16 as llama.cpp keeps them."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    num_blocks: int
    block_size: int

    @staticmethod
    def zeros(n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
              dtype: type[np.floating[Any]] = np.float32) -> "CpuKV":
        shape = (num_blocks * block_size, n_kv_heads, head_dim)
        return CpuKV(
            k=[np.zeros(shape, dtype) for _ in range(n_layers)],
            v=[np.zeros(shape, dtype) for _ in range(n_layers)],
            num_blocks=num_blocks,
            block_size=block_size,
        )

    def gather(self, layer: int, block_table: np.ndarray, context_len: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V of one sequence in position order: each [context_len, Hkv, hd]."""
        n_blocks = -(-context_len // self.block_size)
        slots = (block_table[:n_blocks, None] * self.block_size + np.arange(self.block_size)).reshape(-1)[:context_len]
        return self.k[layer][slots], self.v[layer][slots]


class NumpyKernels(Protocol):
    """The norms, RoPE and attention of a numpy device: kernels/oracle/reference.py (the oracle's
    order) or kernels/llama_cpp/llama_ops.py (llama.cpp's)."""

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float, /) -> np.ndarray: ...

    def rope(self, x: np.ndarray, positions: np.ndarray, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None, /) -> np.ndarray: ...

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float,
                  window: int, /) -> np.ndarray: ...


class NumpyDevice(DeviceBase):
    """What the numpy devices share: CpuKV pools, rounds run eagerly over a plain RoundCtx
    of host arrays, and norms, RoPE and attention from the kernels module `ops`. The
    weights, and the products and activations over them, are each subclass's own."""

    ops: NumpyKernels = ref

    @abstractmethod
    def embed(self, table: Any, token_ids: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray: ...

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> CpuKV:
        return CpuKV.zeros(n_layers, n_kv_heads, head_dim, num_blocks, block_size)

    def begin_round(self, batch: ForwardBatch) -> RoundCtx:
        arrays = (batch.token_ids, batch.positions, batch.slots, batch.logits_rows)
        return RoundCtx(batch, *(self.from_numpy(a) for a in arrays))

    def run_round(self, layers: Layers[CpuKV, RoundCtx], batch: ForwardBatch, kv: CpuKV) -> Any:
        return layers(self, self.begin_round(batch))

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return self.ops.rms_norm(x, w, eps)

    def rope(self, x: np.ndarray, ctx: RoundCtx, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None = None) -> np.ndarray:
        return self.ops.rope(x, ctx.positions, base, rope_dim, interleaved, scaling)

    def write_kv(self, kv: CpuKV, layer: int, k: np.ndarray, v: np.ndarray, ctx: RoundCtx) -> None:
        kv.k[layer][ctx.slots] = k
        kv.v[layer][ctx.slots] = v

    def attention(self, q: np.ndarray, kv: CpuKV, layer: int, ctx: RoundCtx, scale: float, window: int) -> np.ndarray:
        out = np.empty_like(q)  # [T, H, hd]
        for s in ctx.batch.seqs:
            rows = slice(s.start, s.start + s.n_tokens)
            k, v = kv.gather(layer, s.block_table, s.context_len)
            out[rows] = self.ops.attention(q[rows], k, v, ctx.positions[rows], scale, window)
        return out


class CpuDevice(NumpyDevice):
    """numpy device: every product in plain float32 (the oracle). Every weight is a
    float32 array (matrices [out, in])."""

    name = "numpy"

    def upload(self, name: str, tensor: TensorData) -> np.ndarray:
        return np.ascontiguousarray(dequantize(tensor.data, tensor.qtype, tensor.shape), dtype=np.float32)

    def embed(self, table: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        rows: np.ndarray = table[token_ids]  # [T, d]
        return rows

    def linear(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        return ref.linear(x, w, b)

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        return ref.glu(gate, up, act)
