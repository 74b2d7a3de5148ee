"""cpu-llama: the numpy device computing as llama.cpp's CPU backend does.

Activations are rounded to int8 blocks before quantized products, integer block
products are summed in ggml's order (kernels/llama_numerics.py), and norms, RoPE,
softmax, attention and activations follow the order of ggml's float kernels
(kernels/llama_ops.py). Quantized products then equal llama.cpp's bit for bit, and
greedy ids follow llama.cpp's through near-ties. About 8x slower than the oracle
(devices/cpu.py), whose KV layout and round handling it shares.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from zinfer.devices.cpu import CpuDevice
from zinfer.devices.tensor import TensorData
from zinfer.kernels import llama_numerics as ln
from zinfer.kernels import llama_ops as lo
from zinfer.kernels import reference as ref
from zinfer.kernels.quants import dequantize

LM_HEAD = ("output.weight", "token_embd.weight")  # the vocabulary projection (tied or not)


class LlamaMatrix(NamedTuple):
    """A weight matrix as float32 [out, in] and how ggml computes with it."""

    w: np.ndarray
    activation_type: str | None  # llama.cpp's rounding of activations, for types not in exact
    exact: ln.LlamaMatrix | None = None  # integer codes for llama.cpp's own summation order
    rounded: str | None = None  # LM head: the weight type whose int8 rounding to apply before BLAS


class LlamaCpuDevice(CpuDevice):
    """CpuDevice with llama.cpp's arithmetic: its matrices are LlamaMatrix, its norms,
    RoPE and attention those of kernels/llama_ops.py."""

    name = "cpu-llama"
    ops = lo

    def upload(self, name: str, tensor: TensorData) -> np.ndarray | LlamaMatrix:
        w = np.ascontiguousarray(dequantize(tensor.data, tensor.qtype, tensor.shape), dtype=np.float32)
        if len(tensor.shape) == 1:
            return w
        if tensor.qtype.name in ln.EXACT and name in LM_HEAD:
            return LlamaMatrix(w, None, rounded=tensor.qtype.name)
        if tensor.qtype.name in ln.EXACT and len(tensor.shape) == 2:
            return LlamaMatrix(w, None, ln.split_weight(tensor.data, tensor.qtype, tensor.shape))
        return LlamaMatrix(w, ln.ACTIVATION_TYPE.get(tensor.qtype.name))

    def embed(self, table: LlamaMatrix, token_ids: np.ndarray) -> np.ndarray:
        return table.w[token_ids]

    def linear(self, x: np.ndarray, w: LlamaMatrix, b: np.ndarray | None = None) -> np.ndarray:
        if w.exact is not None or w.rounded is not None:
            y = ln.matmul(x, w.exact) if w.exact is not None else ln.matmul_rounded(x, w.w, w.rounded)
            return y if b is None else y + b
        return ref.linear(ln.round_activations(x, w.activation_type), w.w, b)

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        return (lo.gelu_fp16(gate) if act == "gelu_tanh" else lo.silu(gate)) * up
