"""Read a HuggingFace model directory: config.json and one or many .safetensors files.

The safetensors header is parsed here and each tensor memory-mapped, so bf16 (which
numpy lacks) arrives as raw uint16 tagged BF16 and nothing is copied until used.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.devices.tensor import TensorData
from zinfer.models.spec import ModelError

_DTYPES = {"F32": (np.float32, QT.F32), "F16": (np.float16, QT.F16), "BF16": (np.uint16, QT.BF16)}


class SafetensorsDir:
    """An HF directory: `config` (dict) and `tensors` (HF name -> TensorData)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise ModelError(f"{self.path}: no config.json (not a model directory)")
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        files = sorted(self.path.glob("*.safetensors"))
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
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
        header = json.loads(fh.read(header_len))
    header.pop("__metadata__", None)
    base = 8 + header_len
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ModelError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        np_dtype, qtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        if base + end > size:
            raise ModelError(f"{path.name}: truncated file: tensor {name} ends at byte {base + end}, file has {size}")
        shape = tuple(info["shape"])
        out[name] = TensorData(qtype, shape, mm[base + start : base + end].view(np_dtype).reshape(shape))
    return out
