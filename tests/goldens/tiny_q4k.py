"""A tiny Llama whose matrices are all Q4_K, for checking llama.cpp's Q4_K kernels exactly.

Width 256 (one Q4_K block per row), feed-forward 512, 2 layers, 4 heads of 64 over 2 KV
heads; the embedding (tied output) stays F32. Every blk.* matrix is random Q4_K blocks
(gguf-py cannot quantize to Q4_K; random blocks are as valid), so llama.cpp repacks them
all (their row counts are multiples of 8). tests/goldens/regenerate.py --tiny writes
llama.cpp's final hidden states of PROMPT and one decoded token to tiny_q4k.json, with
and without repacking; tests/test_llama_numerics.py compares cpu-llama's bit for bit.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from f32_gguf import writer_with_metadata  # noqa: E402
from tiny import write_tiny_gguf  # noqa: E402

PROMPT = [0, 5, 9, 13, 17, 21]  # 6 rows: a 4-row gemm group and 2 gemv rows
NEXT = 25  # one decode step after the prompt
CONFIG = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=64)
_BLOCK_BYTES = 144  # block_q4_K: d, dmin (fp16), 12 bytes of 6-bit scales and minima, 128 of nibbles


def random_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K blocks for a [rows, cols] matrix: uint8 [rows, cols / 256 * 144];
    weights d * scale * q - dmin * min of magnitude about 0.1."""
    blocks = rng.integers(0, 256, (rows * cols // 256, _BLOCK_BYTES), dtype=np.uint8)
    blocks[:, 0:2] = (rng.uniform(1e-4, 3e-4, len(blocks)).astype(np.float16).view(np.uint8)).reshape(-1, 2)
    blocks[:, 2:4] = (rng.uniform(1e-4, 3e-4, len(blocks)).astype(np.float16).view(np.uint8)).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_tiny_q4k(path: Path, seed: int = 0) -> Path:
    """Write the model to path (overwritten); returns path."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_tiny_gguf(Path(tmp) / "f32.gguf", "llama", seed, **CONFIG)
        reader = GGUFReader(src)
        writer = writer_with_metadata(reader, path)
        for t in reader.tensors:
            data = np.asarray(t.data)
            if t.name.startswith("blk.") and data.ndim == 2:
                writer.add_tensor(t.name, random_q4_k(*data.shape, rng), raw_dtype=QT.Q4_K)
            else:
                writer.add_tensor(t.name, data.astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path
