"""Every weight's numbers finite, checked once at load: a NaN or an infinity in a file
(a bad download, a bad converter, flipped bits) is refused with one line naming the file,
the tensor and the first bad element, instead of surfacing as failed requests later.

One pass over the file's bytes, on the bits: for float tensors every value, for quantized
ones the f16 scales (and mins) of every block, the only numbers a block holds that can be
non-finite (its codes are small integers). Types without a known layout here are left to
the device's upload, which refuses them by name.

That pass reads every page of the file, so a model file of at least MIN_FILE_BYTES that
passed leaves a marker under ~/.cache/zinfer/checked/, keyed like the weight cache (size,
mtime, first and last MiB, this module's source): later loads of the same file skip the
pass. ZINFER_WEIGHT_CACHE=0 turns the markers off too (every load checks).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping

import numpy as np
import platformdirs
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.tensor import TensorData
from zinfer.models.spec import ModelError

# quantized type -> byte offsets of its f16 scales/mins inside one block (ggml's block structs)
_SCALE_OFFSETS: dict[QT, tuple[int, ...]] = {
    QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
    QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
}
# 16-bit float types -> the exponent bits that, all set, make a value inf or NaN
_EXP16 = {QT.F16: 0x7C00, QT.BF16: 0x7F80}
_CHUNK = 1 << 22  # values or blocks looked at per numpy call: bounds the temporaries (~16 MB)
MIN_FILE_BYTES = 64 << 20  # smaller models are checked on every load (milliseconds)
KEEP = 32  # markers kept, the most recent


def check_finite_once(path: Path, tensors: Mapping[str, TensorData]) -> None:
    """check_finite on the model at `path` (a GGUF file or an HF directory), skipped where
    a marker says this very file passed before; a pass leaves one (large files only)."""
    marker = _marker(path)
    if marker is not None and marker.exists():
        return
    check_finite(path.name, tensors)
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            for old in sorted(marker.parent.iterdir(), key=lambda p: p.stat().st_mtime)[:-KEEP]:
                old.unlink(missing_ok=True)
        except OSError:  # an unwritable cache only costs the next load this pass
            pass


def check_finite(file_name: str, tensors: Mapping[str, TensorData]) -> None:
    """Raise ModelError "<file>: tensor <name> has non-finite values (first at element <i>)"
    for the first tensor holding a NaN or an infinity (for a quantized tensor, <i> is the
    first element of the block whose scale is bad)."""
    for name, t in tensors.items():
        at = first_non_finite(t)
        if at is not None:
            raise ModelError(f"{file_name}: tensor {name} has non-finite values (first at element {at})")


def first_non_finite(t: TensorData) -> int | None:
    """The flat index of t's first non-finite element (quantized: its bad block's first), or None."""
    qtype = QT(t.qtype)
    data = np.asarray(t.data)
    if qtype in _SCALE_OFFSETS:
        block, size = GGML_QUANT_SIZES[qtype]
        blocks = data.reshape(-1, size)  # uint8 [n_blocks, block bytes]
        for offset in _SCALE_OFFSETS[qtype]:
            at = _first_bad_bits(blocks[:, offset : offset + 2].view("<u2")[:, 0], 0x7C00)  # [n_blocks] f16 bits
            if at is not None:
                return at * block
        return None
    if qtype in _EXP16:
        return _first_bad_bits(data.reshape(-1).view("<u2"), _EXP16[qtype])
    if qtype == QT.F32:
        return _first_bad_bits(data.reshape(-1).view("<u4"), 0x7F800000)
    if qtype == QT.F64:
        bad = np.flatnonzero(~np.isfinite(data.reshape(-1)))
        return int(bad[0]) if bad.size else None
    return None  # integer tensors, or a type the device's upload will name


def _first_bad_bits(bits: np.ndarray, exponent: int) -> int | None:
    """The index of the first of bits [n] (uint16 or uint32 float bit patterns) whose
    exponent field is all ones (inf or NaN), or None."""
    mask = bits.dtype.type(exponent)
    for start in range(0, bits.shape[0], _CHUNK):
        chunk = bits[start : start + _CHUNK]
        bad = (chunk & mask) == mask
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def _marker(path: Path) -> Path | None:
    """The marker file of this model's bytes and this check's code; None: keep none (small
    model, or the caches are off)."""
    if os.environ.get("ZINFER_WEIGHT_CACHE", "1") == "0":
        return None
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if sum(f.stat().st_size for f in files) < MIN_FILE_BYTES:
        return None
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for f in files:
        st = f.stat()
        digest.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(1 << 20))
            fh.seek(max(0, st.st_size - (1 << 20)))
            digest.update(fh.read(1 << 20))
    return Path(platformdirs.user_cache_dir("zinfer")) / "checked" / digest.hexdigest()[:24]
