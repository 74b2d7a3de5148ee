"""Write an F32 copy of a GGUF file: same metadata, every tensor dequantized.

llama.cpp multiplies quantized weights by activations it first rounds to int8 blocks;
on F32 weights it computes in float32 throughout. Goldens made on the F32 copy
therefore check our forward pass itself, with nothing lost to rounding we do not copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def writer_with_metadata(reader: GGUFReader, dst: Path) -> GGUFWriter:
    """A GGUFWriter to dst holding every metadata key of reader's file (no tensors yet)."""
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    return writer


def write_f32_copy(src: Path, dst: Path) -> Path:
    reader = GGUFReader(src)
    writer = writer_with_metadata(reader, dst)
    for t in reader.tensors:
        writer.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


if __name__ == "__main__":
    write_f32_copy(Path(sys.argv[1]), Path(sys.argv[2]))
