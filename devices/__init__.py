"""zinfer.devices: where the math runs: the cpu devices (numpy, cpu-llama, cpu-fast) and
cuda; weight residency, KV storage, scratch, behind one small protocol.

May import: kernels. Never gateway, actors or models (above), messages or traces: a device
returns arrays, and the executor builds the wire messages and the spans.
"""
