"""Open a model from a GGUF file, an HF safetensors directory or a known name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.tensor import TensorData
from zinfer.models import pull
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.hf_layout import gguf_name, is_norm_weight
from zinfer.models.safetensors_dir import SafetensorsDir
from zinfer.models.spec import ModelError, ModelSpec
from zinfer.models.spec_readers import spec_from_gguf, spec_from_hf_config
from zinfer.models.weight_check import check_finite_once


@dataclass
class ModelSource:
    """A model's spec and canonical (GGUF-named) tensors, not yet on any device."""

    path: Path
    format: str  # "gguf" or "safetensors"
    spec: ModelSpec
    tensors: dict[str, TensorData]
    gguf_metadata: dict[str, Any] = field(default_factory=dict)
    hf_config: dict[str, Any] = field(default_factory=dict)
    release: Callable[[np.ndarray], None] | None = None  # drops a tensor's file pages from RSS (GGUFFile.release)

    def uploader(self, upload: Callable[[str, TensorData], Any]) -> Callable[[str, TensorData], Any]:
        """`upload` (a device's), then the tensor's file pages dropped from this process's
        memory where the device's result does not read them in place (it copied or repacked
        them): the peak RSS of a load is then the device's copies, not those plus the file."""
        if self.release is None:
            return upload
        release = self.release

        def upload_and_release(name: str, tensor: TensorData) -> Any:
            result = upload(name, tensor)
            data = tensor.data
            if isinstance(data, np.ndarray) and not any(np.may_share_memory(a, data) for a in _arrays_in(result)):
                release(data)
            return result

        return upload_and_release

    @property
    def quant_types(self) -> dict[str, int]:
        """Tensor type name -> count, e.g. {'Q4_1': 210, 'F32': 61}."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        return counts

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors.values())

    @property
    def name(self) -> str:
        return str(self.gguf_metadata.get("general.name") or self.path.name)


def resolve(model: str | os.PathLike[str]) -> Path:
    """A known model name (pulled on first use), or a path to a .gguf file or HF directory."""
    text = str(model)
    if text in pull.KNOWN_MODELS:
        return pull.pull(text)
    path = Path(text).expanduser()
    if path.exists():
        return path
    known = ", ".join(sorted(pull.KNOWN_MODELS))
    raise ModelError(f"unknown model {text!r}: not a known name ({known}) and no such file or directory")


def open_model(model: str | os.PathLike[str]) -> ModelSource:
    """Read a model's spec and map its tensors; raises ModelError naming any problem, a
    NaN or an infinity in any weight included (models/weight_check.py)."""
    path = resolve(model)
    if path.is_dir():
        source = _open_hf_dir(path)
    else:
        f = GGUFFile(path)
        spec = spec_from_gguf(f.metadata, tensors=f.tensors)
        source = ModelSource(path, "gguf", spec, f.tensors, gguf_metadata=f.metadata, release=f.release)
    check_finite_once(path, source.tensors)
    return source


def _open_hf_dir(path: Path) -> ModelSource:
    d = SafetensorsDir(path)
    spec = spec_from_hf_config(d.config)
    tensors: dict[str, TensorData] = {}
    for hf, t in d.tensors.items():
        name = gguf_name(hf, spec.arch)
        if name is None:
            continue
        if spec.arch == "gemma3" and is_norm_weight(name):
            t = TensorData(QT.F32, t.shape, _as_f32(t) + np.float32(1.0))  # HF Gemma norms are x * (1 + w)
        tensors[name] = t
    return ModelSource(path, "safetensors", spec, tensors, hf_config=d.config)


def _arrays_in(value: Any, depth: int = 4) -> list[np.ndarray]:
    """The numpy arrays a device's uploaded weight holds: itself, or in its fields, tuples and lists."""
    if isinstance(value, np.ndarray):
        return [value]
    if depth == 0 or value is None or isinstance(value, (str, bytes, int, float)):
        return []
    if isinstance(value, (tuple, list)):
        items: list[Any] = list(value)
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        items = [getattr(value, k) for k in getattr(type(value), "__slots__", ()) if hasattr(value, k)]
    return [a for item in items for a in _arrays_in(item, depth - 1)]


def _as_f32(t: TensorData) -> np.ndarray:
    if t.qtype == QT.BF16:
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    return t.data.astype(np.float32)
