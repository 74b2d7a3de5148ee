"""Read a HuggingFace model directory: config.json and one or many .safetensors files.

The safetensors header is parsed here and each tensor memory-mapped, so bf16 (which
numpy lacks) arrives as raw uint16 tagged BF16 and nothing is copied until used.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.tensor import TensorData
from zinfer.models.spec import ModelError

_DTYPES = {"F32": (np.float32, QT.F32), "F16": (np.float16, QT.F16), "BF16": (np.uint16, QT.BF16)}


class SafetensorsDir:
    """An HF directory: `config` (dict) and `tensors` (HF name -> TensorData)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise ModelError(f"{self.path}: no config.json (not a model directory)")
        self.config: dict[str, Any] = _json(config_path, config_path.read_bytes())
        if not isinstance(self.config, dict):
            raise ModelError(f"{config_path}: not a JSON object")
        files = sorted(self.path.glob("*.safetensors"))
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                names = sorted(set(_json(index, index.read_bytes())["weight_map"].values()))
            except (KeyError, TypeError, AttributeError):
                raise ModelError(f"{index}: no weight_map of shard names") from None
            files = [self.path / n for n in names]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise ModelError(f"{self.path}: shards listed in the index are missing: {', '.join(missing)}")
        if not files:
            raise ModelError(f"{self.path}: no .safetensors files")
        self.tensors: dict[str, TensorData] = {}
        for f in files:
            self.tensors.update(read_safetensors(f))


def read_safetensors(path: Path) -> dict[str, TensorData]:
    """Memory-map one .safetensors file; a truncated file or unknown dtype raises ModelError."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelError(f"{path.name}: truncated safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise ModelError(f"{path.name}: truncated safetensors file (header)")
        header = _json(path, fh.read(header_len))
    if not isinstance(header, dict):
        raise ModelError(f"{path.name}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    base = 8 + header_len
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        try:
            out[name] = _tensor(path, mm, base, size, name, info)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise ModelError(f"{path.name}: corrupt safetensors header entry for tensor {name} ({why})") from None
    return out


def _json(path: Path, raw: bytes) -> Any:
    """raw parsed as JSON; ModelError naming the file when it is not (deep nesting included)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ModelError(f"{path.name}: not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def _tensor(path: Path, mm: np.ndarray, base: int, size: int, name: str, info: Any) -> TensorData:
    """One header entry's tensor, a view of the map mm; ModelError for a dtype or range it cannot be."""
    if info["dtype"] not in _DTYPES:
        raise ModelError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
    np_dtype, qtype = _DTYPES[info["dtype"]]
    start, end = (int(v) for v in info["data_offsets"])
    if base + end > size:
        raise ModelError(f"{path.name}: truncated file: tensor {name} ends at byte {base + end}, file has {size}")
    shape = tuple(int(d) for d in info["shape"])
    n_bytes = math.prod(shape) * np.dtype(np_dtype).itemsize
    if not 0 <= start <= end or any(d < 0 for d in shape) or n_bytes != end - start:
        raise ModelError(f"{path.name}: tensor {name}: shape {list(shape)} does not match its bytes {start}..{end}")
    return TensorData(qtype, shape, mm[base + start : base + end].view(np_dtype).reshape(shape))
