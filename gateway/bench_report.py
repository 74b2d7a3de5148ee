"""`zinfer bench`'s report: every number as one JSON-ready dict, and the printed table.

Rows put zinfer and llama.cpp side by side with zinfer / llama.cpp as the ratio: prefill,
batch-1 decode, each stream count end to end and in the decode window, the largest
stream count against llama.cpp's unified KV pool, and batch-1 GB/s against the
machine's measured read bandwidth.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from zinfer.gateway.bench_plan import Plan

Figures = dict[str, Any]
"""An engine's bench figures by workload key (bench_engine, bench_llama_cpp), or a report's parts."""


def _gb_s(bytes_per_token: int | None, tok_s: float | None) -> float | None:
    return bytes_per_token * tok_s / 1e9 if bytes_per_token and tok_s else None


def roofline(ours: Figures, theirs: Figures | None, peak: float | None) -> Figures:
    """Batch-1 bytes per token and GB/s: zinfer's from the bytes its device holds (and from
    the file's, for comparison), llama.cpp's from the file's with f16 KV; % of peak."""
    tok_s = ours["decode_b1"]["decode_tok_s"]
    file_b, resident_b = ours["weight_file_bytes"], ours.get("weight_resident_bytes")
    kv, kv16 = ours.get("kv_bytes_per_token"), ours["kv_bytes_per_token_f16"]
    out = {
        "weight_file_bytes": file_b,
        "weight_resident_bytes": resident_b,
        "kv_context": ours["kv_context"],
        "kv_bytes_per_token": kv,
        "kv_bytes_per_token_f16": kv16,
        "peak_read_gb_s": peak,
        "zinfer_gb_s": _gb_s(resident_b + kv if resident_b and kv is not None else None, tok_s),
        "zinfer_gb_s_file_bytes": _gb_s(file_b + (kv if kv is not None else kv16), tok_s),
        "llama_cpp_gb_s": _gb_s(file_b + kv16, theirs["decode_b1"]["decode_tok_s"]) if theirs else None,
    }
    for who in ("zinfer", "llama_cpp"):
        gb = out[f"{who}_gb_s"]
        out[f"{who}_peak_pct"] = 100 * gb / peak if gb and peak else None
    return out


def rows(plan: Plan, ours: Figures, theirs: Figures | None, unified: Figures | None, roof: Figures) -> list[Figures]:
    """The table's rows: label, unit, zinfer, llama_cpp, ratio (None where absent)."""
    theirs = theirs or {}
    # (workload key, metric, label, the other engine's figures)
    spec = [("prefill", "prefill_tok_s", f"prefill, {plan.prefill_len}-token prompts", theirs)]
    spec.append(("decode_b1", "decode_tok_s", f"decode, batch 1, {plan.prompt_len}-token prompts", theirs))
    for n in plan.streams:
        spec.append((f"streams_{n}", "e2e_tok_s", f"{n} streams, end to end", theirs))
        spec.append((f"streams_{n}", "decode_tok_s", f"{n} streams, decode window", theirs))
    if "decode_b1_spec" in ours:  # --speculate: the same workloads with drafts, against llama.cpp's plain decoding
        mode = ours["speculation"]["mode"]
        spec.append(("decode_b1_spec", "decode_tok_s", f"decode, batch 1, speculative {mode}", {
            "decode_b1_spec": theirs.get("decode_b1", {})}))
        for n in plan.streams:
            spec.append((f"streams_{n}_spec", "e2e_tok_s", f"{n} streams, end to end, speculative {mode}", {
                f"streams_{n}_spec": theirs.get(f"streams_{n}", {})}))
    if unified:
        n = max(plan.streams)
        spec.append((f"streams_{n}", "e2e_tok_s", f"{n} streams, end to end, llama.cpp unified KV", unified))
        spec.append((f"streams_{n}", "decode_tok_s", f"{n} streams, decode window, llama.cpp unified KV", unified))
    out = []
    for key, metric, label, other in spec:
        a, b = ours[key][metric], other.get(key, {}).get(metric)
        out.append(_row(label, "tok/s", key, metric, a, b, a / b if a and b else None))
    a, b = roof["zinfer_gb_s"], roof["llama_cpp_gb_s"]
    out.append(_row("decode, batch 1, GB/s read", "GB/s", "decode_b1", "gb_s", a, b, a / b if a and b else None))
    a, b = roof["zinfer_peak_pct"], roof["llama_cpp_peak_pct"]
    out.append(_row("decode, batch 1, % of read bandwidth", "%", "decode_b1", "peak_pct", a, b, None))
    return out


def _row(
    label: str, unit: str, workload: str, metric: str, ours: float | None, theirs: float | None, ratio: float | None
) -> Figures:
    return {"label": label, "unit": unit, "workload": workload, "metric": metric, "zinfer": ours, "llama_cpp": theirs,
            "ratio": ratio}


def report_of(
    plan: Plan, threads: int, ours: Figures, theirs: Figures | None, unified: Figures | None, peak: float | None
) -> Figures:
    """Every number of the run as one JSON-ready dict (see the module docstring)."""
    roof = roofline(ours, theirs, peak)
    return {
        "model": ours["model"],
        "device": ours["device"],
        "threads": threads,
        "plan": asdict(plan),
        "rows": rows(plan, ours, theirs, unified, roof),
        "roofline": roof,
        "zinfer": ours,
        "llama_cpp": theirs,
        "llama_cpp_unified": unified,
    }


def _cell(x: float | None, width: int, digits: int = 1) -> str:
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def print_table(report: Figures) -> None:
    p, ours, roof = report["plan"], report["zinfer"], report["roofline"]
    print(f"model {report['model']}  device {report['device']}  threads {report['threads']}  "
          f"decode/stream prompts {p['prompt_len']} tokens, {p['output_len']} out")
    labels = [f"{r['label']} ({r['unit']})" for r in report["rows"]]
    w = max(map(len, labels)) + 2
    print(f"{'':{w}}{'zinfer':>10}{'llama.cpp':>11}{'ratio':>8}")
    for label, r in zip(labels, report["rows"]):
        print(f"{label:{w}}{_cell(r['zinfer'], 10)}{_cell(r['llama_cpp'], 11)}{_cell(r['ratio'], 8, 2)}")
    mb = 1e6
    resident = roof["weight_resident_bytes"]
    kv = roof["kv_bytes_per_token"] if roof["kv_bytes_per_token"] is not None else roof["kv_bytes_per_token_f16"]
    held = f"{resident / mb:.1f} MB" if resident else "unknown"
    kv16 = roof["kv_bytes_per_token_f16"] / mb
    print(f"batch-1 bytes per token: weights {roof['weight_file_bytes'] / mb:.1f} MB in the file, "
          f"{held} as the device holds them; KV {kv / mb:.2f} MB at context {roof['kv_context']} "
          f"(llama.cpp f16: {kv16:.2f} MB)")
    if roof["zinfer_gb_s_file_bytes"] is not None:
        print(f"zinfer batch-1 GB/s counting the file's bytes: {roof['zinfer_gb_s_file_bytes']:.1f}")
    if roof["peak_read_gb_s"]:
        print(f"this machine's read bandwidth: {roof['peak_read_gb_s']:.1f} GB/s ({report['threads']} threads)")
    for n in p["streams"]:
        s = ours[f"streams_{n}"]
        if s["ttft"]:
            ttft, itl = s["ttft"], s["itl"]
            print(f"zinfer {n} streams: ttft p50/p99 {ttft['p50_ms']:.0f}/{ttft['p99_ms']:.0f} ms, "
                  f"itl p50/p99 {itl['p50_ms']:.1f}/{itl['p99_ms']:.1f} ms, "
                  f"first completion {s['first_completion_s']:.2f} s, last first token {s['last_first_token_s']:.2f} s")
    if "speculation" in ours:
        s = ours["speculation"]
        rate = s["accepted_tokens"] / s["drafted_tokens"] if s["drafted_tokens"] else 0.0
        print(f"zinfer speculative {s['mode']}: {s['drafted_tokens']} tokens drafted, {s['accepted_tokens']} accepted "
              f"({rate:.0%}); plain rows ran with drafts off")
    if "rounds" in ours:
        outside = ours["bus_overhead_ms_per_round"]
        print(f"zinfer rounds {ours['rounds']}, time outside the forward {outside:.2f} ms/round")
