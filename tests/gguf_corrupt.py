"""Damage a copy of a GGUF file the way a bad download or a bad converter does: one
tensor's values replaced, or some of its bytes flipped. For tests of what zinfer does
with a model that parses but is wrong."""

from __future__ import annotations

import os
import struct
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


def set_dims(src: str | os.PathLike, dst: str | os.PathLike, name: str, dims: list[int]) -> Path:
    """A copy of src at dst whose tensor `name` claims `dims` (GGUF order, as many as it
    has: the header keeps its size) in its header entry."""
    blob = bytearray(Path(src).read_bytes())
    key = struct.pack("<Q", len(name.encode())) + name.encode()
    at = blob.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", blob, at)
    assert n_dims == len(dims), (n_dims, dims)
    struct.pack_into(f"<{n_dims}Q", blob, at + 4, *[d & (2**64 - 1) for d in dims])
    Path(dst).write_bytes(bytes(blob))
    return Path(dst)


def nested_metadata_gguf(dst: str | os.PathLike, key: str, depth: int) -> Path:
    """A GGUF file with no tensors and one metadata value: an array of arrays `depth` deep
    (each holding one array, the innermost an empty uint32 array)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, 1), struct.pack("<Q", len(key)), key.encode(), struct.pack("<I", 9)]
    out += [struct.pack("<IQ", 9, 1)] * (depth - 1) + [struct.pack("<IQ", 4, 0)]
    Path(dst).write_bytes(b"".join(out))
    return Path(dst)
