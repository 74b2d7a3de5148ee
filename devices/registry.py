"""Devices by name: which one `auto` means on this host, and building one from its options.

Names: auto (the default), cpu / numpy (the float32 oracle), cpu-llama (numpy computing
as llama.cpp's CPU backend does), cpu-fast (numba and int8 kernels on GGUF blocks),
cuda / cuda:N. `auto` is cuda where a GPU works, else cpu-fast where its kernels
compile, else cpu; `resolve_device` says which and why not the others. numba (cpu-fast)
and cupy (cuda) are imported only where asked for, so the numpy devices run on a host
where either fails to import.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import structlog
from gguf import GGMLQuantizationType as QT

from zinfer.devices.base import Device
from zinfer.devices.config import CONFIG_FOR_KIND, CpuFastConfig, CpuLlamaConfig, CudaConfig, DeviceConfig, kind_of
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_llama import LlamaCpuDevice
from zinfer.devices.cuda import CudaDevice  # imports cupy only when a CudaDevice is made
from zinfer.kernels.oracle.quants import dequantize

log = structlog.get_logger("zinfer.devices")


class Resolved(NamedTuple):
    """A concrete device name and why it was chosen."""

    name: str
    reason: str


@functools.cache
def cuda_problem() -> str | None:
    """Why the CUDA device cannot run here, or None when it can (cupy imports, a GPU
    exists and a tiny kernel runs on it)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy build that fails to load its CUDA libraries
        return f"no cupy ({type(exc).__name__}: {exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no GPU"
        if int((cupy.arange(4, dtype=cupy.int32) * 2).sum()) != 12:
            return "a test kernel on the GPU gave a wrong sum"
    except Exception as exc:  # cupy's CUDA errors have no common base beyond Exception
        return f"no working GPU ({type(exc).__name__}: {exc})"
    return None


@functools.cache
def cpu_fast_problem() -> str | None:
    """Why cpu-fast cannot run here, or None when it can (numba imports, its LLVM kernels
    compile for this CPU and a numba kernel computes a tiny product correctly)."""
    try:  # numba and llvmlite: where they fail to import, the numpy devices still run
        from zinfer.kernels.cpu_fast import cpu_quant  # noqa: F401 (numba and the numba kernels import)
        from zinfer.kernels.cpu_fast import gemm_ir
    except Exception as exc:
        return f"no numba ({type(exc).__name__}: {exc})"
    try:
        if gemm_ir.address() is None:
            return "numba kernels failed to compile: llvmlite cannot compile the f32 GEMM kernel for this CPU"
        if not _serial_q8_dot():
            return "numba kernels compiled but a test product came out wrong"
    except Exception as exc:  # numba's compile errors have no common base beyond Exception
        return f"numba kernels failed to compile: {type(exc).__name__}: {exc}"
    return None


def _serial_q8_dot() -> bool:
    """Whether numba computes one Q8_0 block's dot product right, through a serial kernel:
    a parallel kernel launched here, on the thread that resolves the device, would set up
    numba's thread pool on that thread, and every later round on the executor's worker
    thread would run at about half speed."""
    import numba  # optional here: cpu_fast_problem's caller runs without it

    @numba.njit(cache=True)  # from numba's cache after the first start
    def dot(codes: np.ndarray, scale: np.float32, x: np.ndarray) -> np.float32:  # codes [32] int8, x [32] f32
        acc = np.float32(0)
        for i in range(codes.shape[0]):
            acc += np.float32(codes[i]) * x[i]
        return acc * scale

    raw = np.zeros((1, 34), np.uint8)  # one Q8_0 block: fp16 scale 1.0, codes 0..31
    raw[0, 0:2] = np.array([1.0], np.float16).view(np.uint8)
    raw[0, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    got = dot(raw[0, 2:].view(np.int8), np.float32(raw[0, 0:2].view(np.float16)[0]), np.ones(32, np.float32))
    return bool(got == dequantize(raw, QT.Q8_0, (1, 32)).sum())


def resolve_device(name: str) -> Resolved:
    """The concrete device `name` means here: itself, or for "auto" cuda, cpu-fast or cpu
    (the first that works), with the reason; logged at info. ValueError for an unknown
    name, or for cuda / cpu-fast asked for by name where they cannot run (saying why)."""
    kind = kind_of(name)
    if kind != "auto":
        problem = cuda_problem() if kind == "cuda" else cpu_fast_problem() if kind == "cpu-fast" else None
        if problem is not None:
            raise ValueError(f"device {name} cannot run here: {problem}")
        return Resolved(name, "asked for")
    not_cuda = cuda_problem()
    if not_cuda is None:
        picked = Resolved("cuda", "a GPU works")
    else:
        not_fast = cpu_fast_problem()
        if not_fast is None:
            picked = Resolved("cpu-fast", f"not cuda: {not_cuda}")
        else:
            picked = Resolved("cpu", f"not cuda: {not_cuda}; not cpu-fast: {not_fast}")
    log.info("device auto", device=picked.name, reason=picked.reason)
    return picked


def check_options(name: str, options: DeviceConfig | None) -> None:
    """ValueError unless options (None: defaults) are for the device `name` selects."""
    kind = kind_of(name)
    if options is None:
        return
    want = CONFIG_FOR_KIND.get(kind)
    if type(options) is not want:
        given = ", ".join(f"{k}={v}" for k, v in options.changed().items()) or "defaults"
        raise ValueError(f"{type(options).__struct_config__.tag} options ({given}) do not apply to device {name}")


def make_device(name: str, options: DeviceConfig | None = None) -> Device:
    """A Device (devices/base.py) by concrete name ("auto" is resolved first), built with
    its options (None: that device's defaults). ValueError for an unknown name or options
    of another device; ImportError for cuda without cupy."""
    name = resolve_device(name).name
    check_options(name, options)  # options is None or of the kind's config type
    kind = kind_of(name)
    if kind == "cpu":
        return CpuDevice()
    if kind == "cpu-llama":
        return LlamaCpuDevice(repack=(options if isinstance(options, CpuLlamaConfig) else CpuLlamaConfig()).repack)
    if kind == "cpu-fast":
        from zinfer.devices.cpu_fast import FastCpuDevice  # numba: cpu_fast_problem said it imports here

        o = options if isinstance(options, CpuFastConfig) else CpuFastConfig()
        return FastCpuDevice(
            threads=o.threads or None,
            f32_cache_bytes=o.f32_cache_mib << 20,
            int8=o.int8,
            kv_f16=o.kv_f16,
            decode_graphs=o.decode_graphs,
        )
    return CudaDevice(int(name.partition(":")[2] or 0), options if isinstance(options, CudaConfig) else CudaConfig())


def kv_value_bytes(name: str, options: DeviceConfig | None = None) -> int:
    """Bytes per K or V value the device `name` (concrete) keeps: cpu-fast f16 by default, else f32."""
    if kind_of(name) == "cpu-fast":
        return 2 if (options if isinstance(options, CpuFastConfig) else CpuFastConfig()).kv_f16 else 4
    return 4
