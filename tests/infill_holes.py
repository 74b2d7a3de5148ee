"""Ten code holes for fill-in-the-middle (tests/benchmarks/infill_holes.json) and how a middle is
judged: spliced into its file, the file must compile and the hole's small test must pass when
run in a fresh Python with a time limit.

Each hole is a small realistic Python file with one `<FILL>` marker (function bodies, a call
argument, a closing block or return, a condition), a test that exercises the filled file, and
a reference answer (which passes: `python tests/benchmarks/bench_infill.py --check-answers`).
Shared by tests/benchmarks/bench_infill.py and tests/test_infill_real.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HOLES_FILE = Path(__file__).parent / "benchmarks" / "infill_holes.json"
MARKER = "<FILL>"


@dataclass(frozen=True)
class Hole:
    name: str
    kind: str  # "function body", "call argument", "closing block" or "condition"
    prefix: str  # the file before the hole
    suffix: str  # and after it
    test: str  # Python run after the filled file: asserts what the filled code must do
    answer: str  # a middle that passes


def holes() -> list[Hole]:
    """The ten holes, in the data file's order."""
    out = []
    for h in json.loads(HOLES_FILE.read_text()):
        prefix, suffix = h["source"].split(MARKER)
        out.append(Hole(h["name"], h["kind"], prefix, suffix, h["test"], h["answer"]))
    return out


def judge(hole: Hole, middle: str, timeout: float = 10.0) -> str | None:
    """None when the file with `middle` in its hole compiles and its test passes; else why not
    (one line)."""
    source = hole.prefix + middle + hole.suffix
    try:
        compile(source, f"{hole.name}.py", "exec")
    except SyntaxError as exc:
        return f"does not compile: {exc.msg} (line {exc.lineno})"
    try:
        run = subprocess.run([sys.executable, "-I", "-c", source + "\n\n" + hole.test],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"test ran past {timeout:g} s"
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["exit status %d" % run.returncode])[-1]
        return f"test failed: {last[:160]}"
    return None
