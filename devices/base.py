"""The protocols every device implements (RoundOps, the ops a round runs on, and Device),
and DeviceBase, their common defaults.

The forward pass (models/forward.py) calls only the round ops; the round they run in is
described in devices/round.py. Arrays are the device's own (numpy on cpu, cupy on
cuda); only `to_numpy` leaves it.
Shapes: T tokens in the round, d model width, H heads, Hkv KV heads, hd head dim.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Protocol, TypeVar

import numpy as np

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.round import RoundCtx
from zinfer.kernels.oracle.rope import RopeScaling
from zinfer.kernels.tensor import TensorData
from zinfer.kernels.oracle.topk import numpy_topk


class KVStore(Protocol):
    """Paged K/V storage for all layers: num_blocks blocks of block_size token slots each."""

    num_blocks: int
    block_size: int


KV = TypeVar("KV", bound=KVStore)
Ctx = TypeVar("Ctx", bound=RoundCtx)
KV_in = TypeVar("KV_in", bound=KVStore, contravariant=True)
Ctx_in = TypeVar("Ctx_in", bound=RoundCtx, contravariant=True)


class RoundOps(Protocol[KV_in, Ctx_in]):
    """The ops a round runs on; models/forward.py calls only these. A device has them, and so
    do a recorder of its graphs (devices/cpu_graph_recorder.py) and a traced device
    (traces/kernels.py). KV_in is the pool type the device's alloc_kv makes, Ctx_in the
    round context its begin_round makes: an op takes only those."""

    def embed(self, table: Any, token_ids: Any) -> Any:
        """Rows of the embedding table: token ids [T] (host or device) -> [T, d] float32."""

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        """RMSNorm over the last axis of x [..., n] with weight w [n]."""

    def linear(self, x: Any, w: Any, b: Any = None) -> Any:
        """x [T, in] @ w.T (+ b) -> [T, out]."""

    def linears(self, x: Any, ws: tuple[Any, ...], bs: tuple[Any, ...]) -> list[Any]:
        """[linear(x, w, b) for w, b in zip(ws, bs)]: one input through several matrices
        (q/k/v, gate/up), which a device may compute in one launch."""

    def rope(self, x: Any, ctx: Ctx_in, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None = None) -> Any:
        """Rotary embedding on x [T, heads, hd] at the round's positions; scaling: the
        layer's linear/YaRN/frequency-factor scaling (kernels/oracle/rope.py), None for plain RoPE."""

    def write_kv(self, kv: KV_in, layer: int, k: Any, v: Any, ctx: Ctx_in) -> None:
        """Store k, v [T, Hkv, hd] into the layer's pool at the round's slots. Mutates kv."""

    def attention(self, q: Any, kv: KV_in, layer: int, ctx: Ctx_in, scale: float, window: int) -> Any:
        """Paged causal attention of q [T, H, hd] over each sequence's cache -> [T, H, hd]."""

    def glu(self, gate: Any, up: Any, act: str) -> Any:
        """act(gate) * up, both [T, d_ff]."""

    def add(self, x: Any, y: Any) -> Any:
        """x + y, the same shape (the residual stream)."""

    def scale(self, x: Any, s: float) -> Any:
        """x * s in float32 (Gemma's embedding scale)."""

    def take_rows(self, x: Any, rows: Any) -> Any:
        """x [T, d] -> x[rows] [S, d], rows [S] int64 (device)."""

    def from_numpy(self, x: np.ndarray) -> Any:
        """A host array as the device's own."""


Layers = Callable[[RoundOps[KV, Ctx], Ctx], Any]
"""The forward bound to spec, weights and KV pool: (ops, ctx) -> logits [S, vocab]."""


class Device(RoundOps[Any, Any], Protocol):
    """A device: the round ops over its own pool and context types, and what makes them."""

    name: str

    def upload(self, name: str, tensor: TensorData) -> Any:
        """Make one weight resident, in whatever form this device's kernels read."""

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> KVStore:
        """A zeroed pool of num_blocks blocks of block_size slots per layer."""

    def begin_round(self, batch: ForwardBatch) -> RoundCtx:
        """The round's context: batch's arrays on the device and the kernels' metadata, built once."""

    def run_round(self, layers: Layers[Any, Any], batch: ForwardBatch, kv: Any) -> Any:
        """Run one round: layers(ops, ctx) on the ctx of batch, where ops is the object whose
        ops the round runs on (this device; a recorder of its graphs; a traced device passes
        itself), or what the device substitutes for it (a replay of a CUDA or cpu-fast graph
        that kv, the pool layers writes, recorded). kv is a pool this device's alloc_kv made.
        Returns the device logits [S, vocab]."""

    def kernel_clock(self) -> Any:
        """The clock kernel spans read (traces/kernels.py): None for host time (ops that
        finish before they return), else an object with now() and resolve(events)."""

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for work the device started in the background (cpu-fast:
        compiling its decode graphs' replay, populating its KV pools' pages); whether none
        is left. Benchmarks call it after their warm-up, so no timed round shares the CPU
        with a compiler or takes the page faults of a fresh pool."""

    def to_numpy(self, x: Any) -> np.ndarray:
        """A device array on the host."""

    def topk(self, logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best (id, value) of each row of logits [R, V] (device or numpy) on the host:
        ids int64 [R, k], values float32 [R, k], best first, ties to the lower id, NaN never
        chosen (kernels/oracle/topk.py numpy_topk is the reference). k=1 is argmax."""


class DeviceBase(ABC):
    """Defaults for a device: synchronous ops on numpy arrays, host clock for kernel spans.
    A subclass supplies `linear`, which the default `linears` calls."""

    name = "device"

    def kernel_clock(self) -> Any:
        return None  # traces/kernels.HostClock

    def settle(self, timeout: float) -> bool:
        return True

    @abstractmethod
    def linear(self, x: Any, w: Any, b: Any = None) -> Any: ...

    def linears(self, x: Any, ws: tuple[Any, ...], bs: tuple[Any, ...]) -> list[Any]:
        return [self.linear(x, w, b) for w, b in zip(ws, bs)]

    def add(self, x: Any, y: Any) -> Any:
        return x + y

    def scale(self, x: Any, s: float) -> Any:
        return x * np.float32(s)

    def take_rows(self, x: Any, rows: Any) -> Any:
        return x[rows]

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def from_numpy(self, x: np.ndarray) -> Any:
        return x

    def topk(self, logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        return numpy_topk(self.to_numpy(logits), k)
