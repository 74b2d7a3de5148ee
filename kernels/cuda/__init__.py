"""zinfer.kernels.cuda: the CUDA device's kernels, CUDA C sources (*.cu, *.cuh) that
modules compiles with cupy.RawModule and launches.

Imports nothing else of kernels/.
"""
