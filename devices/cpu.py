"""The numpy CPU device: the correctness oracle.

Weights are dequantized to float32 at load (the f32 forward of the DESIGN's measured
facts); KV lives in float32 numpy pools. Every op is a kernels.reference call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zinfer.kernels import llama_numerics as ln
from zinfer.kernels import llama_ops as lo
from zinfer.kernels import reference as ref
from zinfer.devices.base import DeviceBase
from zinfer.devices.round import RoundCtx
from zinfer.devices.tensor import TensorData
from zinfer.kernels.quants import dequantize


@dataclass
class CpuKV:
    """Per layer K and V pools, [num_blocks * block_size, Hkv, hd] (flat slots), float32
    or, on cpu-fast by default, float16 as llama.cpp keeps them."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    num_blocks: int
    block_size: int

    @staticmethod
    def zeros(n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int, dtype=np.float32) -> "CpuKV":
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


LM_HEAD = ("output.weight", "token_embd.weight")  # the vocabulary projection (tied or not)


class CpuMatrix(NamedTuple):
    """A weight matrix as float32 [out, in]; with llama.cpp numerics, also how ggml sees it."""

    w: np.ndarray
    activation_type: str | None  # llama.cpp's rounding of activations, for types not in exact
    exact: ln.LlamaMatrix | None = None  # integer codes for llama.cpp's own summation order
    rounded: str | None = None  # LM head: the weight type whose int8 rounding to apply before BLAS


class CpuDevice(DeviceBase):
    """numpy device: every product in plain float32 (the oracle).

    llama_cpp_numerics=True computes as llama.cpp's CPU backend does instead: activations
    rounded to int8 blocks, integer block products summed in ggml's order
    (kernels/llama_numerics.py), and norms, RoPE, softmax, attention and activations in
    the order of ggml's float kernels (kernels/llama_ops.py). Quantized products then
    equal llama.cpp's bit for bit, and greedy ids follow llama.cpp's through near-ties.
    """

    name = "numpy"

    def __init__(self, llama_cpp_numerics: bool = False):
        self.llama_cpp_numerics = llama_cpp_numerics

    def upload(self, name: str, tensor: TensorData) -> np.ndarray | CpuMatrix:
        w = np.ascontiguousarray(dequantize(tensor.data, tensor.qtype, tensor.shape), dtype=np.float32)
        if len(tensor.shape) == 1:
            return w
        if not self.llama_cpp_numerics:
            return CpuMatrix(w, None)
        if tensor.qtype.name in ln.EXACT and name in LM_HEAD:
            return CpuMatrix(w, None, rounded=tensor.qtype.name)
        if tensor.qtype.name in ln.EXACT and len(tensor.shape) == 2:
            return CpuMatrix(w, None, ln.split_weight(tensor.data, tensor.qtype, tensor.shape))
        return CpuMatrix(w, ln.ACTIVATION_TYPE.get(tensor.qtype.name))

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> CpuKV:
        return CpuKV.zeros(n_layers, n_kv_heads, head_dim, num_blocks, block_size)

    def embed(self, table: CpuMatrix, token_ids: np.ndarray) -> np.ndarray:
        return table.w[token_ids]

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return (lo if self.llama_cpp_numerics else ref).rms_norm(x, w, eps)

    def linear(self, x: np.ndarray, w: CpuMatrix, b: np.ndarray | None = None) -> np.ndarray:
        if w.exact is not None or w.rounded is not None:
            y = ln.matmul(x, w.exact) if w.exact is not None else ln.matmul_rounded(x, w.w, w.rounded)
            return y if b is None else y + b
        return ref.linear(ln.round_activations(x, w.activation_type), w.w, b)

    def rope(self, x: np.ndarray, ctx: RoundCtx, base: float, rope_dim: int, interleaved: bool) -> np.ndarray:
        return (lo if self.llama_cpp_numerics else ref).rope(x, ctx.positions, base, rope_dim, interleaved)

    def write_kv(self, kv: CpuKV, layer: int, k: np.ndarray, v: np.ndarray, ctx: RoundCtx) -> None:
        kv.k[layer][ctx.slots] = k
        kv.v[layer][ctx.slots] = v

    def attention(self, q: np.ndarray, kv: CpuKV, layer: int, ctx: RoundCtx, scale: float, window: int) -> np.ndarray:
        out = np.empty_like(q)  # [T, H, hd]
        for s in ctx.batch.seqs:
            rows = slice(s.start, s.start + s.n_tokens)
            k, v = kv.gather(layer, s.block_table, s.context_len)
            out[rows] = (lo if self.llama_cpp_numerics else ref).attention(q[rows], k, v, ctx.positions[rows], scale, window)
        return out

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        if self.llama_cpp_numerics:
            return (lo.gelu_fp16(gate) if act == "gelu_tanh" else lo.silu(gate)) * up
        return ref.glu(gate, up, act)
