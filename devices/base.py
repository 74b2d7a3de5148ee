"""The capability protocol every device implements; the forward pass calls only these.

Arrays are the device's own (numpy on cpu, cupy on cuda); only `to_numpy` leaves it.
Shapes: T tokens in the round, d model width, H heads, Hkv KV heads, hd head dim.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.tensor import TensorData


class KVStore(Protocol):
    """Paged K/V storage for all layers: num_blocks blocks of block_size token slots each."""

    num_blocks: int
    block_size: int


class Device(Protocol):
    name: str

    def upload(self, name: str, tensor: TensorData) -> Any:
        """Make one weight resident, in whatever form this device's kernels read."""

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> KVStore: ...

    def embed(self, table: Any, token_ids: np.ndarray) -> Any:
        """Rows of the embedding table: [T] -> [T, d] float32."""

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        """RMSNorm over the last axis of x [..., n] with weight w [n]."""

    def linear(self, x: Any, w: Any, b: Any = None) -> Any:
        """x [T, in] @ w.T (+ b) -> [T, out]."""

    def linears(self, x: Any, ws: tuple, bs: tuple) -> list:
        """[linear(x, w, b) for w, b in zip(ws, bs)]: one input through several matrices
        (q/k/v, gate/up), which a device may compute in one launch."""

    def rope(self, x: Any, positions: Any, base: float, rope_dim: int, interleaved: bool) -> Any:
        """Rotary embedding on x [T, heads, hd] at positions [T]."""

    def write_kv(self, kv: KVStore, layer: int, k: Any, v: Any, slots: Any) -> None:
        """Store k, v [T, Hkv, hd] into the layer's slots [T]. Mutates kv."""

    def attention(self, q: Any, kv: KVStore, layer: int, batch: ForwardBatch, scale: float, window: int) -> Any:
        """Paged causal attention of q [T, H, hd] over each sequence's cache -> [T, H, hd]."""

    def glu(self, gate: Any, up: Any, act: str) -> Any:
        """act(gate) * up, both [T, d_ff]."""

    def to_numpy(self, x: Any) -> np.ndarray: ...

    def from_numpy(self, x: np.ndarray) -> Any: ...
