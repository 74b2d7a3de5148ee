"""zinfer.kernels.llama_cpp: llama.cpp's CPU arithmetic reproduced bit for bit in numpy, for the
cpu-llama device: its float ops (llama_ops), its quantized products (llama_numerics) and its
repacked ones (llama_repack).

Imports kernels.oracle only.
"""
