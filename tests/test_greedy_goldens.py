"""Parity with llama.cpp (f32 KV, no flash attention, no weight repacking): prompt ids
and greedy ids.

The goldens come from tests/goldens/regenerate.py, for the quantized model files and for
F32 copies of them (the same weights, dequantized). On the F32 copy llama.cpp computes
in float32 as our oracle does, so greedy ids must agree. On the quantized file it first
rounds activations to int8 blocks: the float32 oracle then takes different near-ties
now and then, while the cpu-llama device (devices/cpu_llama.py LlamaCpuDevice) computes
as llama.cpp does and follows it. Teacher forcing runs the prompt plus llama.cpp's
tokens in one prefill and compares our argmax at every position; the greedy run
prefills, then decodes token by token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from zinfer.actors.engine import make_device
from zinfer.devices.batch import ForwardBatch
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.tokenizer import Tokenizer
from zinfer.models.weights import build_weights

pytestmark = pytest.mark.slow  # every test here loads a real model

GOLDENS = Path(__file__).parent / "goldens"


def load_golden(name: str) -> dict:
    return json.loads((GOLDENS / f"greedy_{name}.json").read_text())


def teacher_forced(source, weights, dev, ids: list[int]) -> np.ndarray:
    """Logits at every position of one prefill of ids: [len(ids), vocab]."""
    spec = source.spec
    blocks = -(-len(ids) // 16)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, blocks, 16)
    batch = ForwardBatch.build([(ids, 0, list(range(blocks)), True)], 16)
    batch = replace(batch, logits_rows=np.arange(len(ids)))
    return round_logits(spec, weights, dev, kv, batch)


def greedy(source, weights, dev, prompt: list[int], n: int, eog: frozenset[int]) -> tuple[list[int], list[np.ndarray]]:
    """Prefill the prompt, then decode token by token as llama.cpp does: ids and logits rows."""
    spec = source.spec
    blocks = -(-(len(prompt) + n) // 16)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, blocks, 16)
    table = list(range(blocks))
    rows = [round_logits(spec, weights, dev, kv, ForwardBatch.build([(prompt, 0, table, True)], 16))[0]]
    out = [int(rows[-1].argmax())]
    while len(out) < n and out[-1] not in eog:
        batch = ForwardBatch.build([([out[-1]], len(prompt) + len(out) - 1, table, True)], 16)
        rows.append(round_logits(spec, weights, dev, kv, batch)[0])
        out.append(int(rows[-1].argmax()))
    return out, rows


def until_eog(ids: list[int], eog: frozenset[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eog:
            return ids[: i + 1]
    return ids


CASES = [
    # golden, model fixture, device, prompts that must match all the way, teacher-forced top-1 agreement
    ("smollm2-135m-f32", "smollm2_path", "cpu", 7, 0.99),
    ("gemma3-270m-f32", "gemma3_path", "cpu", 7, 0.99),
    ("smollm2-135m", "smollm2_path", "cpu", 4, 0.95),
    ("gemma3-270m", "gemma3_path", "cpu", 3, 0.95),
    ("smollm2-135m", "smollm2_path", "cpu-llama", 8, 1.0),
    # teacher forcing: llama.cpp's tokens come from its decode rounds (one row: other kernels)
    # and its own prefill of them takes another near-tie at 4 of Gemma's 256 positions
    ("gemma3-270m", "gemma3_path", "cpu-llama", 8, 0.98),
    # int8 activations as llama.cpp's, f32 scales and another summation order. Rounding
    # to int8 turns a 1-ulp change anywhere upstream into whole code steps: RoPE
    # compiled with and without fma contraction moved the prompts that stay equal
    # between 2 and 4 of 8, while teacher-forced agreement stayed above 0.95
    # (SmolLM2 236-241 of 245, Gemma 248-251 of 256); so the full-match floor is 2
    ("smollm2-135m", "smollm2_path", "cpu-fast", 2, 0.95),
    ("gemma3-270m", "gemma3_path", "cpu-fast", 2, 0.95),
]


@pytest.mark.parametrize("name,fixture,device,min_full,min_agree", CASES)
def test_greedy_parity_with_llama_cpp(name, fixture, device, min_full, min_agree, request, capsys):
    path = request.getfixturevalue(fixture)
    golden = load_golden(name)
    source = open_model(path)
    tok = Tokenizer.from_gguf_metadata(source.gguf_metadata)
    dev = make_device(device)
    weights = build_weights(source.spec, source.tensors, dev.upload)
    full_matches, agree, total, report = 0, 0, 0, []
    for case in golden["cases"]:
        assert tok.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]
        ref = until_eog(case["greedy_ids"], tok.eos_ids)
        p = len(case["prompt_ids"])
        logits = teacher_forced(source, weights, dev, case["prompt_ids"] + ref)[p - 1 : p - 1 + len(ref)]
        agree += int((logits.argmax(axis=1) == np.asarray(ref)).sum())
        total += len(ref)
        ours, rows = greedy(source, weights, dev, case["prompt_ids"], len(case["greedy_ids"]), tok.eos_ids)
        if ours == ref:
            full_matches += 1
        else:
            k = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
            margin = float(rows[k][ours[k]] - rows[k][ref[k]])
            report.append(f"{case['prompt'][:30]!r}: first divergence at token {k}, logit margin {margin:.4f}")
    with capsys.disabled():
        print(f"\n{name} ({device}): greedy equal to llama.cpp on {full_matches}/{len(golden['cases'])} prompts; teacher-forced top-1 agreement {agree}/{total}")
        for line in report:
            print("  " + line)
    assert full_matches >= min_full
    assert agree / total >= min_agree


@pytest.mark.parametrize("device,case_index", [("cpu", 0), ("cpu-llama", 6)])
def test_run_json_matches_llama_cpp(smollm2_path, device, case_index):
    """The CLI path end to end: `zinfer run --raw --temperature 0 --json` (the oracle
    agrees on the first golden prompt; cpu-llama also where the oracle takes another tie)."""
    case = load_golden("smollm2-135m")["cases"][case_index]
    out = subprocess.run(
        [sys.executable, "-m", "zinfer.gateway.cli", "run", "--model", str(smollm2_path), "--device", device, "--raw", "--temperature", "0", "--max-tokens", "32", "--json", case["prompt"]],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["prompt_ids"] == case["prompt_ids"]
    n = len(result["token_ids"])
    assert result["token_ids"] == case["greedy_ids"][:n] and n > 0
