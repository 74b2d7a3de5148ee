"""`zinfer bench` on a tiny random GGUF: every figure exists at any concurrency, and GB/s
comes from the model's bytes. The llama.cpp side runs only where llama-cpp-python imports."""

from __future__ import annotations

import json

import gguf
import pytest
from gguf import GGMLQuantizationType as QT
from tiny import tiny_config, write_tiny_gguf

from zinfer.gateway.bench_figures import group_figures, summarize
from zinfer.gateway.bench_report import print_table
from zinfer.gateway.cli import main

# 24 prompts of 64 tokens against the scheduler's 512-token budget: the first 8 finish
# their 2 tokens while the last ones are still in prefill (the 64-stream bug, scaled down).
SMALL = ["--prefill-len", "32", "--prefill-requests", "1", "--prompt-len", "64", "--output-len", "2",
         "--decode-requests", "1", "--streams", "24"]


def bench_json(capsys, *argv: str) -> dict:
    with pytest.raises(SystemExit) as done:
        main(["bench", *argv, "--json"])
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    return json.loads(out.out)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("bench") / "tiny.gguf", "qwen2", qtype=QT.Q8_0)  # an untied LM head


def test_decode_window_is_never_empty_when_first_streams_finish_before_the_last_starts():
    # stream 0 is done (t=2) before stream 1's first token (t=3): no instant has both decoding
    g = group_figures(0.0, [[1.0, 2.0], [3.0, 4.0]])
    assert (g.tokens, g.e2e_s) == (4, 4.0)
    assert (g.decode_tokens, g.decode_s) == (2, 3.0)
    s = summarize([(0.0, [[1.0, 2.0], [3.0, 4.0]])])
    assert s["e2e_tok_s"] == 1.0 and s["decode_tok_s"] == pytest.approx(2 / 3)


def test_bench_reports_every_figure_at_a_concurrency_where_streams_do_not_overlap(capsys, tiny_path):
    report = bench_json(capsys, "--model", str(tiny_path), "--device", "cpu", *SMALL, "--bandwidth-mib", "8")
    streams = report["zinfer"]["streams_24"]
    assert streams["first_completion_s"] < streams["last_first_token_s"]  # the case the old window was empty in
    assert streams["tokens"] == 48 and streams["e2e_tok_s"] > 0 and streams["decode_tok_s"] > 0
    labels = {r["label"]: r for r in report["rows"]}
    for label in ("prefill, 32-token prompts", "decode, batch 1, 64-token prompts", "24 streams, end to end",
                  "24 streams, decode window"):
        assert labels[label]["zinfer"] > 0 and labels[label]["llama_cpp"] is None

    # GB/s: the bytes every decoded token reads (all tensors but the embedding table) x batch-1 tok/s
    reader = gguf.GGUFReader(str(tiny_path))
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.name != "token_embd.weight")
    # the oracle holds f32
    f32_bytes = sum(4 * int(t.n_elements) for t in reader.tensors if t.name != "token_embd.weight")
    c = tiny_config("qwen2")
    # f32 K and V, mean context 65
    kv = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * (64 + 1) * 4
    roof = report["roofline"]
    assert (roof["weight_file_bytes"], roof["weight_resident_bytes"], roof["kv_bytes_per_token"]) == (
        file_bytes, f32_bytes, kv)
    tok_s = report["zinfer"]["decode_b1"]["decode_tok_s"]
    assert roof["zinfer_gb_s"] == pytest.approx((f32_bytes + kv) * tok_s / 1e9)
    assert roof["peak_read_gb_s"] > 0 and roof["zinfer_peak_pct"] == pytest.approx(
        100 * roof["zinfer_gb_s"] / roof["peak_read_gb_s"])

    print_table(report)  # what `zinfer bench` prints without --json: a line per row
    table = capsys.readouterr().out
    assert all(r["label"] in table for r in report["rows"]) and "read bandwidth" in table


def test_bench_refuses_sizes_with_nothing_to_decode(capsys, tiny_path):
    with pytest.raises(SystemExit) as done:
        main(["bench", "--model", str(tiny_path), "--device", "cpu", "--output-len", "1"])
    assert done.value.code == 1
    assert "--output-len must be at least 2" in capsys.readouterr().err


def test_llama_cpp_side_by_side_in_separate_and_unified_kv(capsys, tiny_path):
    pytest.importorskip("llama_cpp")
    report = bench_json(capsys, "--model", str(tiny_path), "--device", "cpu", *SMALL, "--bandwidth-mib", "0",
                        "--compare-llama-cpp")
    labels = {r["label"]: r for r in report["rows"]}
    for label in ("prefill, 32-token prompts", "decode, batch 1, 64-token prompts", "24 streams, end to end",
                  "24 streams, decode window",
                  "24 streams, end to end, llama.cpp unified KV", "24 streams, decode window, llama.cpp unified KV"):
        row = labels[label]
        assert row["llama_cpp"] > 0 and row["ratio"] == pytest.approx(row["zinfer"] / row["llama_cpp"])
    assert report["roofline"]["llama_cpp_gb_s"] > 0
    assert report["llama_cpp"]["streams_24"]["tokens"] == 48
