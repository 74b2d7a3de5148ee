"""Whether this process may run the AMX tile kernels (amx_ir.py): the CPU has AMX-TILE and
AMX-INT8, and Linux granted the process the tile data state.

Linux gives a process the XTILEDATA state (8 KiB of tile registers per thread) only after
it asks: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) (syscall 158 with 0x1023 and
18). The permission is the process's: every thread it has or starts afterwards may then use
the tiles (numba's worker threads included; tests/test_amx.py runs the kernels on them), and
a tile instruction without it is a SIGILL. `tiles_permitted()` asks once per process, before
any AMX kernel is compiled, and logs one line either way; where the CPU lacks AMX or the OS
refuses, the int8 products keep their VNNI / AVX2 kernels.

`kernels_choice()` is the int8 kernels a run is asked to use: ZINFER_INT8_KERNELS=amx, vnni
or avx2 forces one for A/B runs (amx where the tiles are not permitted falls back to vnni;
ZINFER_INT8_ISA=avx2, the older switch, counts as avx2); unset, AMX where permitted.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

import structlog

from zinfer.kernels.cpu_fast import llvm_host

log = structlog.get_logger("zinfer.kernels")

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
KERNELS_ENV = "ZINFER_INT8_KERNELS"  # "amx", "vnni" or "avx2"
ISA_ENV = "ZINFER_INT8_ISA"  # ir.ISA_ENV: "avx2" asks for the AVX2 kernels (and so no tiles)
CHOICES = ("amx", "vnni", "avx2")
AMX_FEATURES = ("+amx-tile", "+amx-int8")


def cpu_has_amx(features: str) -> bool:
    """Whether a CPU with these LLVM features ("+avx512vnni,...,+amx-int8") runs AMX-INT8 tiles."""
    flags = set(features.split(","))
    return all(f in flags for f in AMX_FEATURES) and "+avx512f" in flags


@functools.cache
def tiles_permitted() -> bool:
    """Whether this process may run AMX tile instructions: asks Linux once per process
    (later calls return the first answer) and logs the outcome."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        features = llvm_host.host_features()
    except (RuntimeError, OSError):
        return False
    if not cpu_has_amx(features):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    if rc != 0:
        errno = ctypes.get_errno()
        log.warning("amx tiles refused by the OS; int8 products stay on VNNI", errno=errno, why=os.strerror(errno))
        return False
    log.info("amx tiles permitted: int8 prefill products on AMX-INT8")
    return True


def kernels_choice() -> str:
    """The int8 kernels asked for: ZINFER_INT8_KERNELS when set to one of CHOICES, else
    "amx" where the tiles are permitted, else "vnni" (the products' own VNNI / AVX2 pick).
    ValueError for any other value of the variable."""
    asked = os.environ.get(KERNELS_ENV, "")
    if asked and asked not in CHOICES:
        raise ValueError(f"{KERNELS_ENV}={asked!r}: want one of {', '.join(CHOICES)}")
    if asked in ("vnni", "avx2"):
        return asked
    if os.environ.get(ISA_ENV) == "avx2":  # the AVX2 kernels asked for the older way: no tiles either
        return "avx2"
    return "amx" if tiles_permitted() else "vnni"
