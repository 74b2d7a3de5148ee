"""LLVM IR compiled for this machine's CPU by llvmlite (numba's own LLVM): where the
hand-written kernels of kernels/int8_ir.py and kernels/gemm_ir.py become machine code.
Callers treat ImportError, RuntimeError and OSError as "no such kernel here"."""

from __future__ import annotations

_ENGINES: list = []  # compiled code lives as long as its engine


def host_features() -> str:
    """The host CPU's LLVM feature string, e.g. "+avx2,+avx512vnni,...,-amx-tile"."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.get_host_cpu_features().flatten()


def compile_for_host(ir_text: str, names: list[str]) -> dict[str, int]:
    """Compile a module of IR for the host CPU at -O3; the machine-code address of each
    named function."""
    import llvmlite.binding as llvm

    features = host_features()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=3)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    _ENGINES.append(engine)
    return {name: engine.get_function_address(name) for name in names}
