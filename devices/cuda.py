"""The CUDA device (cupy): GGUF-block weights resident on the GPU, paged f32 KV, our kernels.

Weights stay in their GGUF block formats (rows padded to 16 bytes) and are dequantized
inside the kernels: a fused matvec for rounds of up to `matvec_max_tokens` rows, and a
dequantize-into-scratch + cuBLAS GEMM above that. F32 matrices go straight to cuBLAS.
The KV pool is float32 per layer, [(num_blocks + 1) * block_size, Hkv, hd] (the extra
block is a trash block the CUDA-graph decode path pads batches into), so attention
matches the numpy oracle (devices/cpu.py) to f32 rounding.

Round metadata (token ids, positions, slots, block tables, ...) is uploaded once per
round, by begin_round, into reused device buffers that the round's CudaRoundCtx views;
activations come from cupy's memory pool (no cudaMalloc once warm), the GEMM scratch is
one reused buffer. With CudaConfig.cuda_graphs, run_round replays decode rounds as
CUDA graphs (devices/cuda_graph.py); kernel spans read CUDA events (kernel_clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gguf import GGMLQuantizationType as QT

from zinfer.devices.base import DeviceBase, Layers
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.config import CudaConfig  # defined there, importable without cupy
from zinfer.devices.cuda_clock import CudaEventClock
from zinfer.devices.cuda_graph import CudaKV, DecodeGraphs
from zinfer.devices.cuda_round import CudaRoundCtx, RoundMeta
from zinfer.devices.round import RopeKey
from zinfer.devices.fallback import F32Fallbacks
from zinfer.kernels.cuda import modules as km
from zinfer.kernels.oracle.quants import dequantize
from zinfer.kernels.oracle.rope import RopeScaling
from zinfer.kernels.oracle.rope import angles as rope_angles
from zinfer.kernels.oracle.rope import inv_freq as rope_inv_freq
from zinfer.kernels.oracle.rope import rotate as rope_rotate
from zinfer.kernels.tensor import TensorData

F32, F16, BF16 = 0, 1, 30


@dataclass
class GpuMatrix:
    """A [rows, cols] weight on the GPU: f32 [rows, cols] for F32, else uint8 [rows, row_stride] blocks."""

    qtype: int
    rows: int
    cols: int
    data: Any
    row_stride: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class CudaDevice(DeviceBase):
    """The Device protocol (devices/base.py) on one NVIDIA GPU.

    With config.cuda_graphs, each pool alloc_kv makes carries the decode graphs captured
    over it, and a decode round on that pool replays them."""

    def __init__(self, index: int = 0, config: CudaConfig | None = None) -> None:
        import cupy  # optional: the cuda extra

        self.index = index
        self.name = f"cuda:{index}"
        self.config = config or CudaConfig()
        self.cupy = cupy
        cupy.cuda.Device(index).use()
        self.stream = cupy.cuda.Stream(non_blocking=False)  # blocking: ordered with the legacy stream
        self._eager_meta: RoundMeta | None = None  # eager rounds' metadata buffers, grown to the largest
        self._scratch: Any = None  # uint8 cupy array: a dequantized weight for the GEMM path, grown to the largest
        self._rope_inv: dict[RopeKey, tuple[Any, float]] = {}  # -> (inv_freq [rope_dim/2] f32 on the device, mscale)
        self._f32_fallbacks = F32Fallbacks(self.name)  # types without a kernel, warned once each

    # ---- weights and KV ----

    def upload(self, name: str, tensor: TensorData) -> Any:
        """Matrices as a GpuMatrix, in GGUF blocks where a kernel reads the type; 1-D tensors
        (norms, biases) as f32 cupy arrays."""
        cp = self.cupy
        qtype, shape = int(tensor.qtype), tuple(int(s) for s in tensor.shape)
        if len(shape) == 1:
            return cp.asarray(_host_f32(tensor.data, qtype, shape))
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        raw = np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8)
        if qtype == F32:
            return GpuMatrix(F32, rows, cols, cp.asarray(raw.view(np.float32).reshape(rows, cols)))
        blocks = km.KERNEL_BLOCKS.get(qtype)
        if blocks is None or cols % blocks[0]:
            f32 = _host_f32(tensor.data, qtype, shape)  # UnsupportedTensorType where nothing reads the type
            why = "no CUDA kernel for this type"
            if blocks is not None:
                why = f"rows of {cols} values are not whole {blocks[0]}-value blocks"
            self._f32_fallbacks.note(name, _type_name(qtype), f32.size, raw.size, why)
            return GpuMatrix(F32, rows, cols, cp.asarray(f32.reshape(rows, cols)))
        row_bytes = cols // blocks[0] * blocks[1]
        if raw.size != rows * row_bytes:
            raise ValueError(f"{name}: {raw.size} bytes for a {shape} tensor of type {qtype}")
        stride = -(-row_bytes // 16) * 16
        host = raw.reshape(rows, row_bytes)
        if stride != row_bytes:
            padded = np.zeros((rows, stride), np.uint8)
            padded[:, :row_bytes] = host
            host = padded
        return GpuMatrix(qtype, rows, cols, cp.asarray(host), stride)

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> CudaKV:
        if head_dim > km.MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} > {km.MAX_HEAD_DIM} is not supported by the CUDA attention kernels")
        cp = self.cupy
        shape = ((num_blocks + 1) * block_size, n_kv_heads, head_dim)
        c = self.config
        graphs = DecodeGraphs(num_blocks, block_size, c.graph_buckets, c.graph_max_context) if c.cuda_graphs else None
        return CudaKV([cp.zeros(shape, cp.float32) for _ in range(n_layers)],
                      [cp.zeros(shape, cp.float32) for _ in range(n_layers)], num_blocks, block_size, graphs)

    # ---- rounds ----

    def begin_round(self, batch: ForwardBatch, meta: RoundMeta | None = None) -> CudaRoundCtx:
        """Upload batch's token ids, positions, slots and attention metadata (two copies on
        the current stream) into the reused eager buffers, or into `meta`'s fixed-capacity
        ones (a captured graph's); the round's ctx views them."""
        width = max([len(s.block_table) for s in batch.seqs] + [1])
        if meta is None:
            meta = self._eager_meta
            if meta is None or not meta.fits(batch, width):
                meta = RoundMeta(max(batch.n_tokens, 64) * 2, max(len(batch.seqs), 8) * 2, max(width, 64) * 2)
                self._eager_meta = meta
        elif not meta.fits(batch, width):
            raise ValueError("batch does not fit the given metadata buffers")
        meta.fill(batch)
        T, S = batch.n_tokens, len(batch.logits_rows)
        return CudaRoundCtx(batch, meta.tok[:T], meta.pos[:T], meta.slots[:T], meta.rows[:S], meta)

    def run_round(self, layers: Layers[CudaKV, CudaRoundCtx], batch: ForwardBatch, kv: CudaKV) -> Any:
        """layers(self, ctx) -> device logits [S, vocab]; with config.cuda_graphs, a decode
        round that fits a bucket replays the graph kv's graphs captured for it instead."""
        if kv.graphs is not None and kv.graphs.eligible(batch):
            return kv.graphs.run(self, layers, batch)
        return layers(self, self.begin_round(batch))

    def kernel_clock(self) -> Any:
        """Kernel spans in device time: CUDA events, resolved once the round has synchronized."""
        return CudaEventClock()

    # ---- ops ----

    def embed(self, table: GpuMatrix, token_ids: Any) -> Any:
        cp = self.cupy
        ids = cp.asarray(token_ids)  # the ctx's device ids: no copy
        if ids.dtype != cp.int64:
            ids = ids.astype(cp.int64)
        if table.qtype == F32:
            return table.data[ids]  # [T, d]
        out = cp.empty((ids.shape[0], table.cols), cp.float32)
        km.dequant_rows(table.qtype, table.data, table.row_stride, table.cols, ids.shape[0], out, rows=ids)
        return out

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        x = self.cupy.ascontiguousarray(x, dtype=self.cupy.float32)
        y = self.cupy.empty_like(x)
        km.rms_norm(x, w, y, eps)
        return y

    def linear(self, x: Any, w: GpuMatrix, b: Any = None) -> Any:
        cp = self.cupy
        x = cp.ascontiguousarray(x, dtype=cp.float32)  # [T, in]
        T = x.shape[0]
        if w.qtype == F32:
            y = cp.matmul(x, w.data.T)  # cuBLAS SGEMM
            if b is not None:
                y += b
            return y
        y = cp.empty((T, w.rows), cp.float32)  # [T, out]
        if T <= self.config.matvec_max_tokens:
            for c in range(0, T, km.MV_MAX_COLS):
                chunk = slice(c, c + km.MV_MAX_COLS)  # rows of x and y
                km.matvec(w.qtype, w.data, w.row_stride, w.cols, w.rows, x[chunk], y[chunk], b)
            return y
        dt = cp.float16 if self.config.gemm_dtype == "f16" else cp.float32
        wf = self._scratch_for(w.rows * w.cols, dt).reshape(w.rows, w.cols)
        km.dequant_rows(w.qtype, w.data, w.row_stride, w.cols, w.rows, wf)
        if dt == cp.float16:
            y[...] = cp.matmul(x.astype(cp.float16), wf.T)  # f16 tensor cores, f32 accumulate
        else:
            cp.matmul(x, wf.T, out=y)
        if b is not None:
            y += b
        return y

    def rope(self, x: Any, ctx: CudaRoundCtx, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None = None) -> Any:
        cp = self.cupy
        x = cp.ascontiguousarray(x, dtype=cp.float32)  # [T, heads, hd]
        if scaling is not None and not scaling.is_identity:
            return self._scaled_rope(x, ctx, base, rope_dim, interleaved, scaling)
        y = cp.empty_like(x)
        km.rope(x, ctx.positions, y, base, rope_dim, interleaved)  # positions: int64 [T] on the device
        return y

    def _scaled_rope(self, x: Any, ctx: CudaRoundCtx, base: float, rope_dim: int, interleaved: bool,
                     scaling: RopeScaling) -> Any:
        """Linear/YaRN/frequency-factor RoPE in cupy array ops over the device positions.

        The tables are made on every call, not cached in the ctx: a captured graph's ctx
        is warmed up once and then replayed at other positions. inv_freq is uploaded once
        per key, before any capture (the warm-up round makes it)."""
        key = (float(base), int(rope_dim), scaling)
        inv = self._rope_inv.get(key)
        if inv is None:
            host, mscale = rope_inv_freq(base, rope_dim, scaling)  # [rope_dim/2] f32
            inv = self._rope_inv[key] = (self.cupy.asarray(host), float(mscale))
        cos, sin = rope_angles(self.cupy, ctx.positions, inv[0], inv[1])  # [T, rope_dim/2] each
        return rope_rotate(self.cupy, x, cos, sin, interleaved)

    def write_kv(self, kv: CudaKV, layer: int, k: Any, v: Any, ctx: CudaRoundCtx) -> None:
        cp = self.cupy
        km.write_kv(cp.ascontiguousarray(k, dtype=cp.float32), cp.ascontiguousarray(v, dtype=cp.float32), ctx.slots,
                    kv.k[layer], kv.v[layer])

    def attention(self, q: Any, kv: CudaKV, layer: int, ctx: CudaRoundCtx, scale: float, window: int) -> Any:
        cp = self.cupy
        q = cp.ascontiguousarray(q, dtype=cp.float32)  # [T, H, hd]
        meta = ctx.meta
        out = cp.empty_like(q)
        n_kv = kv.k[layer].shape[1]
        if meta.n_dec:
            km.attn_decode(q, kv.k[layer], kv.v[layer], out, meta.dec_rows, meta.dec_seq, meta.n_dec, meta.pos,
                           meta.tables, kv.block_size, n_kv, scale, window)
        if meta.n_tiles:
            km.attn_prefill(q, kv.k[layer], kv.v[layer], out, meta.tile_seq, meta.tile_q0, meta.n_tiles,
                            meta.seq_start, meta.seq_ntok, meta.pos, meta.tables, kv.block_size, n_kv, scale, window)
        return out

    def glu(self, gate: Any, up: Any, act: str) -> Any:
        cp = self.cupy
        gate = cp.ascontiguousarray(gate, dtype=cp.float32)
        out = cp.empty_like(gate)
        km.glu(gate, cp.ascontiguousarray(up, dtype=cp.float32), out, act)
        return out

    def to_numpy(self, x: Any) -> np.ndarray:
        """Copy to the host (waits for the work that writes x)."""
        host: np.ndarray = self.cupy.asnumpy(x)
        return host

    def from_numpy(self, x: np.ndarray) -> Any:
        return self.cupy.asarray(x)

    # ---- sampling support ----

    def topk(self, logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best (id, value) of each row of logits [R, V] (device or numpy), best
        first, ties to the lower id: ids int64 [R, k], values float32 [R, k]. k=1 is argmax."""
        cp = self.cupy
        x = cp.ascontiguousarray(cp.asarray(logits, dtype=cp.float32))
        if x.ndim == 1:
            x = x[None]
        R, V = x.shape
        if not 1 <= k <= V:
            raise ValueError(f"k must be in 1..{V}, got {k}")
        ids = cp.empty((R, k), cp.int64)
        vals = cp.empty((R, k), cp.float32)
        if R:
            km.topk_rows(x, k, ids, vals)
        return cp.asnumpy(ids), cp.asnumpy(vals)

    def _scratch_for(self, n: int, dtype: Any) -> Any:
        """A scratch array of n values of dtype (a cupy dtype), reusing one buffer."""
        cp = self.cupy
        itemsize = np.dtype(dtype).itemsize
        if self._scratch is None or self._scratch.nbytes < n * itemsize:
            self._scratch = None
            self._scratch = cp.empty(n * itemsize, cp.uint8)
        return self._scratch[:n * itemsize].view(dtype)


def _type_name(qtype: int) -> str:
    try:
        return QT(qtype).name
    except ValueError:
        return f"ggml type {qtype}"


def _host_f32(data: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of a tensor on the host (for 1-D tensors and types without a kernel)."""
    raw = np.ascontiguousarray(data).reshape(-1)
    if qtype == F32:
        return raw.view(np.float32).reshape(shape).astype(np.float32)
    if qtype == F16:
        return raw.view(np.float16).reshape(shape).astype(np.float32)
    if qtype == BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return dequantize(data, qtype, shape).astype(np.float32)
