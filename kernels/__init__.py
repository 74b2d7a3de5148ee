"""zinfer.kernels."""
