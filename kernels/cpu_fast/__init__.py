"""zinfer.kernels.cpu_fast: the cpu-fast device's kernels. numba float kernels (cpu_ops,
cpu_quant, cpu_prefill_attention), the decode tape's replay (cpu_tape), a float32 GEMM
micro-kernel in LLVM IR (gemm_ir), the int8 products (int8/, entry point int8.products), and
what they share: code_cache (where compiled code is kept, under one key scheme),
compile_cache (numba kernels compiled by a helper process, once the device routes them),
llvm_host (IR compiled by llvmlite), kernel_signature (an IR kernel's parameters) and
numba_types (typed faces of numba's API).

Imports kernels.oracle (block_fields) and nothing of kernels.llama_cpp or kernels.cuda.
"""
