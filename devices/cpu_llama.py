"""cpu-llama: the numpy device computing as llama.cpp's CPU backend does.

Activations are rounded to int8 blocks before quantized products, integer block
products are summed in ggml's order (kernels/llama_cpp/llama_numerics.py), and norms, RoPE,
softmax, attention and activations follow the order of ggml's float kernels
(kernels/llama_cpp/llama_ops.py). Quantized products then equal llama.cpp's bit for bit, and
greedy ids follow llama.cpp's through near-ties. It shares the oracle's KV layout and
round handling (devices/cpu.py NumpyDevice).

repack=True (the default, as llama.cpp runs by default) multiplies the weights llama.cpp
repacks on an x86 AVX2/AVX-512 host by its repacked kernels' arithmetic
(kernels/llama_cpp/llama_repack.py); repack=False as llama.cpp with use_extra_bufts=False. As
llama.cpp (inp_out_ids), the last layer's feed-forward runs on the rows whose logits the
round returns only; the other rows of its output are left zero.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuKV, NumpyDevice
from zinfer.devices.round import RoundCtx
from zinfer.kernels.tensor import TensorData
from zinfer.kernels.llama_cpp import llama_numerics as ln
from zinfer.kernels.llama_cpp import llama_ops as lo
from zinfer.kernels.llama_cpp import llama_repack as lr
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.quants import dequantize

LM_HEAD = ("output.weight", "token_embd.weight")  # the vocabulary projection (tied or not)


class LlamaMatrix(NamedTuple):
    """A weight matrix as float32 [out, in] (None where `exact` holds it) and how ggml computes with it."""

    w: np.ndarray | None
    activation_type: str | None  # llama.cpp's rounding of activations, for types not in exact
    exact: ln.LlamaMatrix | None = None  # integer codes for llama.cpp's own summation order
    rounded: str | None = None  # LM head: the weight type whose int8 rounding to apply before BLAS
    repacked: bool = False  # exact is multiplied by llama.cpp's repacked kernels
    ffn_layer: int | None = None  # blk.N.ffn_*: N

    @property
    def f32(self) -> np.ndarray:
        """w, for the matrices that hold it (every one but exact's)."""
        if self.w is None:
            raise ValueError("this matrix is held as integer codes (exact) only")
        return self.w


class LlamaCpuDevice(NumpyDevice):
    """The numpy device with llama.cpp's arithmetic: its matrices are LlamaMatrix, its
    norms, RoPE and attention those of kernels/llama_cpp/llama_ops.py."""

    name = "cpu-llama"
    ops = lo

    def __init__(self, repack: bool = True) -> None:
        self.repack = repack
        self._last_layer: int | None = None  # the last layer's index, while a round runs it
        self._out_rows: np.ndarray | None = None  # [S] that round's logits rows

    def upload(self, name: str, tensor: TensorData) -> np.ndarray | LlamaMatrix:
        kind = tensor.qtype.name
        parts = name.split(".")
        ffn_layer = int(parts[1]) if parts[0] == "blk" and parts[2].startswith("ffn_") else None
        repacked = self.repack and name != "token_embd.weight" and lr.repacks(kind, tensor.shape)
        exact = lr.EXACT if repacked else ln.EXACT
        if kind in exact and len(tensor.shape) == 2 and name not in LM_HEAD:
            split = lr.split_weight if repacked else ln.split_weight
            codes = split(tensor.data, tensor.qtype, tensor.shape)
            return LlamaMatrix(None, None, codes, repacked=repacked, ffn_layer=ffn_layer)
        w = np.ascontiguousarray(dequantize(tensor.data, tensor.qtype, tensor.shape), dtype=np.float32)
        if len(tensor.shape) == 1:
            return w
        if kind in ln.EXACT and name in LM_HEAD:
            return LlamaMatrix(w, None, rounded=kind)
        # other types (and repacked ones not reproduced): their activation rounding only
        return LlamaMatrix(w, ln.ACTIVATION_TYPE.get(kind), ffn_layer=ffn_layer)

    def embed(self, table: LlamaMatrix, token_ids: np.ndarray) -> np.ndarray:
        rows: np.ndarray = table.f32[token_ids]  # [T, d]
        return rows

    def begin_round(self, batch: ForwardBatch) -> RoundCtx:
        self._last_layer = self._out_rows = None
        return super().begin_round(batch)

    def attention(self, q: np.ndarray, kv: CpuKV, layer: int, ctx: RoundCtx, scale: float, window: int) -> np.ndarray:
        """The oracle's attention; remembers whether this is the last layer and the round's
        logits rows, for that layer's feed-forward (linear)."""
        last = layer == len(kv.k) - 1
        self._last_layer, self._out_rows = (layer, np.asarray(ctx.logits_rows)) if last else (None, None)
        return super().attention(q, kv, layer, ctx, scale, window)

    def linear(self, x: np.ndarray, w: LlamaMatrix, b: np.ndarray | None = None) -> np.ndarray:
        """x [T, in] @ w.T (+ b) -> [T, out] in llama.cpp's arithmetic. The last layer's
        feed-forward multiplies only the logits rows (llama.cpp's inp_out_ids), whose count
        picks llama.cpp's kernels; its other rows are zero."""
        rows = self._out_rows
        if w.ffn_layer is not None and w.ffn_layer == self._last_layer and rows is not None and len(rows) < len(x):
            y = np.zeros((len(x), w.exact.d.shape[0] if w.exact is not None else w.f32.shape[0]), np.float32)
            if len(rows):  # a prefill chunk that returns no logits computes none of these rows
                y[rows] = self._product(x[rows], w, b)
            return y
        return self._product(x, w, b)

    def _product(self, x: np.ndarray, w: LlamaMatrix, b: np.ndarray | None) -> np.ndarray:
        if w.exact is not None and w.repacked:
            y = lr.matmul(x, w.exact)
        elif w.exact is not None:
            y = ln.matmul(x, w.exact)
        elif w.rounded is not None:
            y = ln.matmul_rounded(x, w.f32, w.rounded)
        else:
            return ref.linear(ln.round_activations(x, w.activation_type), w.f32, b)
        return y if b is None else y + b

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        out: np.ndarray = (lo.gelu_fp16(gate) if act == "gelu_tanh" else lo.silu(gate)) * up  # [T, d_ff]
        return out
