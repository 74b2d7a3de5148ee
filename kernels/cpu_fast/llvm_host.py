"""LLVM IR compiled by llvmlite (numba's own LLVM): for this machine's CPU, where the
hand-written kernels of int8/ir.py and gemm_ir.py become machine code, or to assembly for
a named CPU, so that tests check the IR on any host.
Callers treat RuntimeError and OSError as "no such kernel here"."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm

from zinfer.kernels.cpu_fast import code_cache

_ENGINES: list[Any] = []  # compiled code lives as long as its engine
X86_64 = "x86_64-unknown-linux-gnu"


def host_features() -> str:
    """The host CPU's LLVM feature string, e.g. "+avx2,+avx512vnni,...,-amx-tile"."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features: str = llvm.get_host_cpu_features().flatten()
    return features


def _parsed(ir_text: str) -> Any:
    """The verified llvmlite module of ir_text; RuntimeError on a syntax or verifier error."""
    module = llvm.parse_assembly(ir_text)
    module.verify()
    return module


def compile_for_host(ir_text: str, names: list[str], cache_dir: Path | None = None) -> dict[str, int]:
    """Compile a module of IR for the host CPU at -O3; the machine-code address of each
    named function. With `cache_dir` (code_cache.llvm_dir()), the object code is kept there
    under code_cache.object_name(ir_text), and a later call loads it instead of compiling."""
    features = host_features()
    cpu = llvm.get_host_cpu_name()
    module = _parsed(ir_text)
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
    engine = llvm.create_mcjit_compiler(module, machine)
    if cache_dir is not None:
        _use_object_cache(engine, Path(cache_dir) / code_cache.object_name(ir_text))
    engine.finalize_object()
    _ENGINES.append(engine)
    return {name: int(engine.get_function_address(name)) for name in names}


def _use_object_cache(engine: Any, path: Path) -> None:
    """Let `engine` load its object code from `path` if there, and write it there once
    compiled (to a temporary name, then renamed: a reader never sees half a file)."""

    def load(_module: Any) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    def store(_module: Any, code: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(code)
            partial.replace(path)
        except OSError:
            pass  # a cache we cannot write only costs the next start a compile

    engine.set_object_cache(store, load)


def compile_for_target(ir_text: str, cpu: str, features: str, triple: str = X86_64) -> str:
    """The -O3 assembly of a module of IR for `cpu` with LLVM `features` (e.g.
    "+avx512vnni,+avx2"), by a target machine, not the JIT: no such CPU needed here."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = _parsed(ir_text)
    module.triple = triple
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3)
    assembly: str = machine.emit_assembly(module)
    return assembly
