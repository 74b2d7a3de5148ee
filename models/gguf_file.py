"""Read a GGUF file: decoded metadata and memory-mapped tensors, no full copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf

from zinfer.devices.tensor import TensorData
from zinfer.models.spec import ModelError


class GGUFFile:
    """An opened GGUF file: `metadata` (key -> Python value) and `tensors` (name -> TensorData)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        try:
            reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # the reader raises bare ValueErrors/IndexErrors on bad bytes
            raise ModelError(f"{self.path.name}: truncated or corrupt GGUF file ({_first_line(exc)})") from None
        self.metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            try:
                self.metadata[key] = field.contents()
            except Exception:
                continue  # a field type gguf-py cannot decode is one we do not need
        self.tensors: dict[str, TensorData] = {}
        size = self.path.stat().st_size
        for t in reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise ModelError(f"{self.path.name}: truncated file: tensor {t.name} ends at byte {end}, file has {size}")
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors[t.name] = TensorData(gguf.GGMLQuantizationType(t.tensor_type), shape, t.data)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
