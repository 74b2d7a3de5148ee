"""zinfer.kernels.cpu_fast.int8: quantized products with int8 activations on VNNI or AVX2.

products is the entry point: its docstring is the layout table, and the device imports
nothing else of this package. Below it: layouts (the weights repacked), activations (x
rounded to int8), ir (the row kernels' LLVM IR and their compile) and ir_* (its parts).
"""
