"""Damage a copy of a GGUF file the way a bad download or a bad converter does: one
tensor's values replaced, or some of its bytes flipped. For tests of what zinfer does
with a model that parses but is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from zinfer.models.gguf_file import GGUFFile


def tensor_span(path: str | os.PathLike, name: str) -> tuple[int, int]:
    """(byte offset in the file, byte length) of tensor `name`'s data."""
    f = GGUFFile(path)
    data = f.tensors[name].data
    return int(data.ctypes.data - f._map.ctypes.data), int(data.nbytes)


def set_values(src: str | os.PathLike, dst: str | os.PathLike, name: str, values: np.ndarray) -> Path:
    """A copy of src at dst whose F32 tensor `name` holds `values` (broadcast to its size)."""
    offset, nbytes = tensor_span(src, name)
    blob = bytearray(Path(src).read_bytes())
    blob[offset : offset + nbytes] = np.broadcast_to(np.asarray(values, np.float32), (nbytes // 4,)).tobytes()
    Path(dst).write_bytes(bytes(blob))
    return Path(dst)


def flip_bytes(src: str | os.PathLike, dst: str | os.PathLike, name: str, at: list[int], masks: list[int]) -> Path:
    """A copy of src at dst with byte at[i] of tensor `name`'s data xor-ed with masks[i]."""
    offset, nbytes = tensor_span(src, name)
    blob = bytearray(Path(src).read_bytes())
    for i, m in zip(at, masks):
        blob[offset + i % nbytes] ^= m & 0xFF
    Path(dst).write_bytes(bytes(blob))
    return Path(dst)
