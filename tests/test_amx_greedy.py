"""Real models on AMX tiles give the VNNI kernels' logits bit for bit, so their greedy
tokens (kernels/cpu_fast/int8/amx_*.py).

One upload per model (its matrices carry both the int8 view and the tile layout); the
same rounds run with the tiles on (amx_products.MIN_ROWS as shipped) and off (MIN_ROWS
past any round): a teacher-forced prefill of a golden prompt and llama.cpp's tokens (37+
rows: on the tiles), and a greedy run from a prompt of 32+ tokens (its prefill on the
tiles, then decode). Every int8 path applies the block scales in one float order
(tests/int8_canonical.py), so a product does not depend on the path its round took, and
neither do the logits nor the tokens.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from test_greedy_goldens import greedy, load_golden, teacher_forced
from zinfer.devices.registry import make_device
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_products
from zinfer.models.loader import open_model
from zinfer.models.tokenizer import Tokenizer
from zinfer.models.weights import build_weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not amx_host.tiles_permitted(), reason="needs a CPU with AMX-INT8 and the OS's permission"),
]
# the 1.5B passes too (117 s on the 2-core host under load, past the slow tier's budget):
# ZINFER_AMX_ALL_MODELS=1 adds it
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] + (
    ["qwen2.5-coder-1.5b"] if os.environ.get("ZINFER_AMX_ALL_MODELS") == "1" else []
)
GREEDY_TOKENS = 6


@pytest.mark.parametrize("model", MODELS)
def test_tiles_give_the_vnni_kernels_logits_bit_for_bit(model, monkeypatch):
    from conftest import _model

    monkeypatch.delenv(amx_host.KERNELS_ENV, raising=False)
    source = open_model(_model(model))
    tok = Tokenizer.from_gguf_metadata(source.gguf_metadata)
    dev = make_device("cpu-fast", None)
    weights = build_weights(source.spec, source.tensors, dev.upload)
    golden = load_golden(model)
    case = golden["cases"][0]
    forced = case["prompt_ids"] + case["greedy_ids"]
    long_prompt = [t for c in golden["cases"][:4] for t in c["prompt_ids"]]
    assert len(forced) >= amx_products.MIN_ROWS and len(long_prompt) >= amx_products.MIN_ROWS
    launches = []
    product = amx_products.product
    monkeypatch.setattr(amx_products, "product", lambda *a: launches.append(a[1].shape[0]) or product(*a))
    runs = {}
    for path, min_rows in (("tiles", amx_products.MIN_ROWS), ("vnni", 1 << 30)):
        monkeypatch.setattr(amx_products, "MIN_ROWS", min_rows)
        logits = teacher_forced(source, weights, dev, forced)
        ids, _ = greedy(source, weights, dev, long_prompt, GREEDY_TOKENS, tok.eos_ids)
        runs[path] = (logits, ids)
        if path == "tiles":
            assert len(launches) >= 2 * source.spec.n_layers  # both prefills' linears ran on the tiles
    (tiles, tile_ids), (vnni, vnni_ids) = runs["tiles"], runs["vnni"]
    np.testing.assert_array_equal(tiles, vnni)
    assert tile_ids == vnni_ids
