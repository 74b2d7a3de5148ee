"""Every CUDA source compiles for Hopper (sm_90) with nvcc, as the files and as the
text cupy.RawModule receives (local includes inlined), so a syntax error fails CI even
on machines without a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from zinfer.kernels.cuda import modules as cuda_modules

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
SOURCES = sorted(p.stem for p in cuda_modules.SOURCE_DIR.glob("*.cu"))

pytestmark = [
    pytest.mark.slow,  # nvcc takes 2-9 s a source
    pytest.mark.skipif(NVCC is None, reason="nvcc not found (no CUDA toolkit): CUDA sources not compile-checked"),
]


def _nvcc(path: Path, out: Path) -> None:
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-I", str(cuda_modules.SOURCE_DIR), "-c", str(path), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed on {path.name}:\n{res.stderr}"


def test_sources_exist():
    assert {"matvec", "dequant", "elementwise", "attention", "sampling"} <= set(SOURCES)


@pytest.mark.parametrize("name", SOURCES)
def test_source_file_compiles(name, tmp_path):
    _nvcc(cuda_modules.SOURCE_DIR / f"{name}.cu", tmp_path / f"{name}.o")


@pytest.mark.parametrize("name", SOURCES)
def test_inlined_module_text_compiles(name, tmp_path):
    src = tmp_path / f"{name}_inlined.cu"
    src.write_text(cuda_modules.source(name))
    assert '#include "' not in src.read_text()
    _nvcc(src, tmp_path / f"{name}.o")


def test_launchers_name_existing_kernels():
    """Every kernel a launcher asks for by name is defined in the source text."""
    text = {n: cuda_modules.source(n) for n in SOURCES}
    for suffix in cuda_modules.KERNEL_TYPES.values():
        assert f"MATVEC(mv_{suffix}," in text["matvec"]
        assert f"DEQUANT(dq_{suffix}," in text["dequant"]
    for mod, fn in [("elementwise", "rms_norm"), ("elementwise", "rope"), ("elementwise", "glu"),
                    ("attention", "write_kv"), ("attention", "attn_decode"), ("attention", "attn_prefill"),
                    ("sampling", "topk_rows")]:
        assert f" {fn}(" in text[mod], (mod, fn)
