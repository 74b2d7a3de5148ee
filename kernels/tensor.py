"""TensorData: one tensor as a file stores it (its ggml type, shape and raw data).

The weight readers (models/) make it, every device's `upload` reads it, and the
dequantizers (oracle/quants.py) take its three fields.
"""

from __future__ import annotations

from typing import NamedTuple

import gguf
import numpy as np


class TensorData(NamedTuple):
    """One tensor as stored: its type, numpy-order shape ([out, in] for matrices) and raw data.

    For quantized types `data` is uint8 [rows, row_bytes]; for float types it is the typed
    array. Both are views of the memory map: nothing is read until used.
    """

    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray
