"""Read a GGUF file: decoded metadata and memory-mapped tensors, no full copy.

The header is parsed here with `struct` over the memory map instead of through
`gguf.GGUFReader`, which builds numpy views for every part of every value (slow on a
large vocabulary's tokens, merges and types). Values decode as
`GGUFReader.fields[key].contents()` gives them (scalars as Python numbers, strings as
str, arrays as flat lists; numeric arrays through numpy's tolist), and tensors are the
same memory-map views (`tests/test_startup.py` checks both).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from zinfer.kernels.tensor import TensorData
from zinfer.models.spec import ModelError

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
MAX_NESTING = 8  # arrays of arrays deeper than this are refused (real files nest 1 or 2)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# GGUF value type -> numpy dtype of its scalars (little-endian)
_SCALARS: dict[int, np.dtype[Any]] = {
    0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"), 4: np.dtype("<u4"),
    5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("?"), 10: np.dtype("<u8"), 11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}
# element types that are not block-quantized: the tensor is a typed array of its elements
_PLAIN = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
          gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
          gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
          gguf.GGMLQuantizationType.I64: np.int64}


class GGUFFile:
    """An opened GGUF file: `metadata` (key -> Python value) and `tensors` (name -> TensorData)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        name = self.path.name
        try:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the file, read-only
            self._map = np.frombuffer(self._mmap, np.uint8)  # uint8 [file bytes], a view of the map
            header = _Header(memoryview(self._mmap))
            self.metadata: dict[str, Any] = header.read_metadata()
            infos = header.read_tensor_infos()
        except (ValueError, IndexError, OverflowError, struct.error, KeyError) as exc:  # bad bytes in the header
            raise ModelError(f"{name}: truncated or corrupt GGUF file ({_first_line(exc)})") from None
        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise ModelError(f"{name}: corrupt GGUF file (general.alignment {alignment!r} is not a power of two)")
        data_start = -(-header.offset // alignment) * alignment
        self.tensors: dict[str, TensorData] = {}
        for tensor, dims, qtype, rel in infos:
            if rel % alignment:
                raise ModelError(f"{name}: corrupt GGUF file: tensor {tensor} data offset {rel} "
                                 f"is not a multiple of the alignment {alignment}")
            self.tensors[tensor] = self._tensor(tensor, dims, qtype, data_start + rel)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def release(self, data: np.ndarray) -> None:
        """Drop the pages of `data` (a view of this file's map) from the process's memory.

        The map is read-only and file-backed, so this only unmaps: the next read of those
        bytes faults them back in from the page cache, with the same contents. Called
        once a device has copied a tensor into its own layout, so the file's copy stops
        counting in RSS."""
        offset = data.ctypes.data - self._map.ctypes.data
        if not 0 <= offset <= self._map.size - data.nbytes:
            raise ValueError("release: the array is not a view of this file")
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (offset + data.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _tensor(self, name: str, dims: tuple[int, ...], raw_type: int, start: int) -> TensorData:
        """One tensor's view of the map: typed [*shape] for plain types, uint8 [rows, row_bytes] for quantized."""
        try:
            qtype = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            raise ModelError(f"{self.path.name}: tensor {name} has unknown type {raw_type}") from None
        shape = tuple(reversed(dims))  # numpy order: [out, in]
        if not 1 <= len(shape) <= MAX_DIMS or min(shape) < 1:
            raise ModelError(f"{self.path.name}: corrupt GGUF file: tensor {name} has dimensions {list(dims)} "
                             f"(1 to {MAX_DIMS}, each at least 1)")
        n_elems = math.prod(shape)  # Python ints: a product of corrupt dims cannot wrap around
        if qtype not in gguf.GGML_QUANT_SIZES:
            raise ModelError(f"{self.path.name}: tensor {name} has unsupported type {qtype.name}")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if shape[-1] % block:
            raise ModelError(f"{self.path.name}: tensor {name} row of {shape[-1]} is not a multiple of "
                             f"{qtype.name}'s block of {block}")
        n_bytes = n_elems // block * type_size
        end = start + n_bytes
        if end > self._map.size:
            raise ModelError(f"{self.path.name}: truncated file: tensor {name} ends at byte {end}, "
                             f"file has {self._map.size}")
        raw = self._map[start:end]
        if qtype in _PLAIN:
            data = raw.view(_PLAIN[qtype]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
        return TensorData(qtype, shape, data)


class _Header:
    """A cursor over the header bytes; each read advances `offset`."""

    def __init__(self, buf: memoryview):
        self.buf, self.offset = buf, 0
        if bytes(buf[:4]) != _MAGIC:
            raise ValueError("GGUF magic invalid")
        self.offset = 4
        version = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} not supported (2 or 3)")
        self.n_tensors, self.n_kv = self._unpack("<Q"), self._unpack("<Q")

    def read_metadata(self) -> dict[str, Any]:
        """Every key/value pair, decoded; a repeated key is an error, as in gguf-py."""
        meta: dict[str, Any] = {}
        for _ in range(self.n_kv):
            key = self._string()
            if key in meta:
                raise ValueError(f"duplicate metadata key {key}")
            try:
                meta[key] = self._value(self._unpack("<I"))
            except (ValueError, IndexError, OverflowError, struct.error) as exc:
                raise ValueError(f"metadata key {key}: {_first_line(exc)}") from None
        return meta

    def read_tensor_infos(self) -> list[tuple[str, tuple[int, ...], int, int]]:
        """(name, dims in GGUF order, raw type, offset from the data start) per tensor."""
        infos, names = [], set()
        for _ in range(self.n_tensors):
            name = self._string()
            if name in names:
                raise ValueError(f"duplicated tensor {name}")
            names.add(name)
            n_dims = self._unpack("<I")
            dims = tuple(int(d) for d in self._array(_SCALARS[10], n_dims))
            infos.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        return infos

    def _unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        end = self.offset + n
        if end > len(self.buf):
            raise ValueError(f"string of {n} bytes runs past the end of the file")
        text = str(self.buf[self.offset:end], "utf-8")
        self.offset = end
        return text

    def _strings(self, count: int) -> list[str]:
        """`count` length-prefixed strings: the vocabulary's hot loop, kept to plain slicing."""
        buf, off, size, out = self.buf, self.offset, len(self.buf), []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = length(buf, off)
            off += 8
            if off + n > size:
                raise ValueError(f"string of {n} bytes runs past the end of the file")
            out.append(str(buf[off:off + n], "utf-8"))
            off += n
        self.offset = off
        return out

    def _array(self, dtype: np.dtype, count: int) -> np.ndarray:
        end = self.offset + count * dtype.itemsize
        if end > len(self.buf):
            raise ValueError(f"array of {count} values runs past the end of the file")
        values = np.frombuffer(self.buf, dtype, count, self.offset)
        self.offset = end
        return values

    def _value(self, vtype: int, depth: int = 0) -> Any:
        """One value of type vtype; `depth`: the arrays it is nested in (MAX_NESTING at most)."""
        if vtype == _STRING:
            return self._string()
        if vtype in _SCALARS:
            return self._array(_SCALARS[vtype], 1).tolist()[0]
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        item_type, count = self._unpack("<I"), self._unpack("<Q")
        if item_type == _STRING:
            return self._strings(count)
        if item_type in _SCALARS:
            return self._array(_SCALARS[item_type], count).tolist()
        if item_type == _ARRAY:  # nested arrays come out flat, as gguf-py gives them
            if depth >= MAX_NESTING:
                raise ValueError(f"arrays nested more than {MAX_NESTING} deep")
            return [x for _ in range(count) for x in self._value(_ARRAY, depth + 1)]
        raise ValueError(f"unknown GGUF array item type {item_type}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
