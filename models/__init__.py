"""zinfer.models: what a model is: its spec, weight readers, tokenizer and chat template,
and the one forward pass over a device protocol.

May import: devices (models/forward.py only: the forward pass runs on the device protocol;
the spec and the weight readers know no device), kernels. Never gateway or actors (above),
messages or traces: a model knows no wire and records no spans.
"""
