"""zinfer.kernels: the numerics of every device, by family, and TensorData (tensor.py), a
tensor as a file stores it.

May import: no other zinfer folder. They know no model, device or wire.

- oracle/: the numpy oracle every faster path is checked against (the `cpu` device's ops,
  GGUF dequantization, RoPE tables, the top-k order).
- llama_cpp/: llama.cpp's CPU arithmetic reproduced bit for bit (the `cpu-llama` device).
- cpu_fast/: numba and LLVM IR kernels (the `cpu-fast` device), its int8 products in
  cpu_fast/int8/, and the cache of compiled code (cpu_fast/code_cache.py).
- cuda/: CUDA C sources and their cupy launchers (the `cuda` device).

Every family may import oracle/ and tensor.py, and none another family. Importing this
package or any family changes nothing in the process: numba's compiles are routed through
the helper process only when a cpu-fast device asks (cpu_fast/compile_cache.route_compiles).
"""
