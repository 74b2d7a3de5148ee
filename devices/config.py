"""Typed options of each device, importable without the device's libraries (cupy, numba).

One Struct per device kind, tagged by `kind` so `DeviceConfig` (their union) round-trips
through msgspec: the ipc/tcp topologies send EngineConfig, these included, to their child
processes as JSON. Each validates itself when built or decoded: a bad value is a
ValueError (msgspec.ValidationError when decoded) that names the field.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec


class _Options(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    """Common base: frozen, unknown fields refused, tagged by device kind. Each subclass
    restates frozen=True, which msgspec inherits but mypy's reading of it does not."""

    def changed(self) -> dict[str, object]:
        """The fields set away from their defaults, {name: value} (for error messages)."""
        defaults = type(self)()
        return {f: getattr(self, f) for f in self.__struct_fields__ if getattr(self, f) != getattr(defaults, f)}


class CpuConfig(_Options, tag="cpu", frozen=True):
    """The numpy oracle (devices/cpu.py): float32 everywhere, nothing to choose."""


class CpuLlamaConfig(_Options, tag="cpu-llama", frozen=True):
    """numpy with llama.cpp's CPU arithmetic (devices/cpu_llama.py, LlamaCpuDevice).

    repack: multiply the weights llama.cpp repacks on an x86 AVX2/AVX-512 host (Q4_K ...)
    as its repacked kernels do, as llama.cpp runs by default; False: its plain kernels,
    as llama.cpp with use_extra_bufts=False."""

    repack: bool = True


class CpuFastConfig(_Options, tag="cpu-fast", frozen=True):
    """The numba device (devices/cpu_fast.py).

    threads: numba threads, 0 for every core. int8: the int8 kernels (None: wherever
    the CPU has AVX512-VNNI or AVX2; True on a CPU with neither falls back to the float kernels).
    kv_f16: K and V kept in f16 as llama.cpp does (else f32, as the oracle). f32_cache_mib:
    memory for f32 copies of quantized matrices, which large rounds multiply through BLAS
    on CPUs without VNNI (0: dequantize tiles on the fly instead). decode_graphs: decode
    rounds of up to 16 sequences recorded once per shape and replayed in one numba call
    (devices/cpu_graph.py)."""

    threads: int = 0
    int8: bool | None = None
    kv_f16: bool = True
    f32_cache_mib: int = 1024
    decode_graphs: bool = True

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0: every core), not {self.threads}")
        if self.f32_cache_mib < 0:
            raise ValueError(f"f32_cache_mib must be >= 0, not {self.f32_cache_mib}")


class CudaConfig(_Options, tag="cuda", frozen=True):
    """The CUDA device (devices/cuda.py).

    matvec_max_tokens: rounds up to this many rows use the fused dequantizing matvec
    (in chunks of 8 rows); bigger ones dequantize to scratch and call cuBLAS.
    gemm_dtype: 'f32' (parity with the oracle) or 'f16' (tensor cores) for that scratch.
    cuda_graphs: capture decode rounds per batch-size bucket (devices/cuda_graph.py);
    graph_buckets: those batch sizes; graph_max_context: the longest context a graph covers."""

    matvec_max_tokens: int = 64
    gemm_dtype: Literal["f32", "f16"] = "f32"
    cuda_graphs: bool = False
    graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    graph_max_context: int = 8192

    def __post_init__(self) -> None:
        if self.gemm_dtype not in ("f32", "f16"):
            raise ValueError(f"gemm_dtype must be 'f32' or 'f16', not {self.gemm_dtype!r}")
        if self.matvec_max_tokens < 1:
            raise ValueError("matvec_max_tokens must be >= 1")
        if any(b < 1 for b in self.graph_buckets):
            raise ValueError(f"graph buckets must be >= 1, not {self.graph_buckets}")
        if self.graph_buckets and max(self.graph_buckets) > self.matvec_max_tokens:
            raise ValueError("graph buckets must not exceed matvec_max_tokens (the GEMM path allocates scratch)")
        if self.graph_max_context < 1:
            raise ValueError("graph_max_context must be >= 1")


DeviceConfig = Union[CpuConfig, CpuLlamaConfig, CpuFastConfig, CudaConfig]

CONFIG_FOR_KIND: dict[str, type[DeviceConfig]] = {
    "cpu": CpuConfig,
    "cpu-llama": CpuLlamaConfig,
    "cpu-fast": CpuFastConfig,
    "cuda": CudaConfig,
}
DEVICE_NAMES = ("auto", "cpu", "numpy", "cpu-llama", "cpu-fast", "cuda", "cuda:N")


def kind_of(name: str) -> str:
    """The device kind a --device name selects: 'auto', 'cpu' (also 'numpy'), 'cpu-llama',
    'cpu-fast' or 'cuda' (also 'cuda:N'). ValueError for any other name."""
    if name in ("auto", "cpu", "cpu-llama", "cpu-fast", "cuda"):
        return name
    if name == "numpy":
        return "cpu"
    prefix, colon, index = name.partition(":")
    if prefix == "cuda" and colon and index.isdigit():
        return "cuda"
    raise ValueError(f"unknown device {name!r} ({', '.join(DEVICE_NAMES)})")
