"""zinfer.kernels.oracle: the numpy oracle every faster path is checked against: the reference
ops (reference), GGUF block dequantization (quants, gguf-py's dequantizers) and the readers of
the fields inside a block (block_fields), RoPE tables with llama.cpp's scaling (rope) and the
top-k order (topk).

Imports no other kernels/ family; all of them may import it.
"""
