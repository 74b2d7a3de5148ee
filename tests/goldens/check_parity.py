"""Every golden prompt of every model through a device, against llama.cpp (run by hand).

    python3 tests/goldens/check_parity.py [--models M ...] [--devices D ...]

Prints, per model and device, "n/8 prompts equal, teacher-forced top-1 agreement a/b"
with the first divergence of each prompt that differs, using the comparison of
tests/test_greedy_goldens.py (compare). The issue's bar for cpu-llama is >= 7 of 8 on
each of the four models. Devices: cpu-llama (llama.cpp's default weight repacking,
against greedy_<model>.json), cpu-llama-norepack (against greedy_<model>-norepack.json,
where llama.cpp repacks some weight), cpu, cpu-fast. cpu-llama takes minutes per model
(about 8x the oracle's time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from regenerate import MODELS  # noqa: E402
from test_greedy_goldens import GOLDENS, NO_REPACK, compare  # noqa: E402

from zinfer.models.pull import cached_path  # noqa: E402

DEVICES = {  # name -> (device, options, golden suffix)
    "cpu-llama": ("cpu-llama", None, ""),
    "cpu-llama-norepack": ("cpu-llama", NO_REPACK, "-norepack"),
    "cpu": ("cpu", None, ""),
    "cpu-fast": ("cpu-fast", None, ""),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--devices", nargs="+", default=["cpu-llama"], choices=list(DEVICES))
    ap.add_argument("--prompts", type=int, default=None, help="only the first N prompts (default: all 8)")
    args = ap.parse_args()
    for model in args.models:
        path = cached_path(model)
        if path is None:
            print(f"{model}: not pulled (zinfer pull {model})")
            continue
        for name in args.devices:
            device, options, suffix = DEVICES[name]
            golden = f"{model}{suffix}"
            if not (GOLDENS / f"greedy_{golden}.json").exists():
                print(f"{model} ({name}): no greedy_{golden}.json (llama.cpp repacks none of its weights)")
                continue
            result = compare(golden, path, device, options, slice(args.prompts))
            print(f"{model} ({name}): {result.line()}", flush=True)
            for line in result.divergences:
                print("  " + line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
