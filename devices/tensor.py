"""TensorData, as the devices/ files import it; it lives in kernels/tensor.py, below both
the weight readers (models/) and the devices."""

from __future__ import annotations

from zinfer.kernels.tensor import TensorData

__all__ = ["TensorData"]
