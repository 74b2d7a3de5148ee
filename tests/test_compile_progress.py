"""A first cpu-fast run tells stderr how its kernel compile goes (kernels/cpu_fast/compile_cache.py):
the first line, then a line every few seconds with the seconds spent, the kernels done and
the one in hand, then the total. On a loaded 2-core host the first compile takes minutes:
one line and then silence looked like a hang."""

from __future__ import annotations

import os
import re
import sys
import time

import numba
import numpy as np
import pytest

from test_first_run import _PROBE  # the same one-kernel module

from zinfer.kernels.cpu_fast import compile_cache


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A fresh module of one cached numba kernel routed through the helper, with an empty
    numba cache, no helper yet and progress told every 0.05 s (its total at exit)."""
    name = f"progress_probe_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setattr(compile_cache, "KERNEL_MODULES", name)
    monkeypatch.setattr(compile_cache, "_helper", None)
    monkeypatch.setattr(compile_cache, "_helper_broken", False)
    compile_cache.route_compiles()  # as a cpu-fast device does when built
    monkeypatch.setattr(compile_cache, "PROGRESS_EVERY_S", 0.05)
    monkeypatch.setattr(compile_cache, "QUIET_S", 60.0)
    __import__(name)
    yield sys.modules.pop(name).scaled_sum
    if compile_cache._helper is not None:
        compile_cache._helper.close()


def test_a_first_compile_prints_progress_lines_and_then_its_total(probe, capfd):
    """Two signatures compiled by the helper (its start-up, numba's import, counts towards
    the first): progress lines with growing seconds and the count done, then the total."""
    assert probe(np.arange(4.0), 2.0) == 12.0
    assert probe(np.arange(3, dtype=np.int64), 3) == 9
    compile_cache._helper.progress._at_exit()  # what a short run's exit tells
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == compile_cache.FIRST_COMPILE_NOTE
    assert re.fullmatch(r"zinfer: compiled 2 cpu-fast kernels in \d+ s; later runs start from cache", lines[-1]), lines
    progress = [re.fullmatch(r"zinfer: compiling cpu-fast kernels: (\d+) s, [01] done, now \S+scaled_sum", line)
                for line in lines[1:-1]]
    assert progress and all(progress), lines
    seconds = [int(m.group(1)) for m in progress]
    assert seconds == sorted(seconds)


def test_progress_lines_come_while_kernels_compile_even_when_each_is_quicker_than_the_interval(monkeypatch, capfd):
    """Many short compiles (the usual first run: dozens of kernels of a few seconds each)
    still give a line per interval, counting the kernels done, and one total once idle.
    Later compiles (while the answer streams) are told only at exit."""
    monkeypatch.setattr(compile_cache, "PROGRESS_EVERY_S", 0.1)
    monkeypatch.setattr(compile_cache, "QUIET_S", 0.2)
    progress = compile_cache._Progress()
    for i in range(20):
        progress.begin(f"cpu_ops.kernel_{i}")
        time.sleep(0.03)
        progress.end()
    time.sleep(0.5)
    # this progress's lines only: a worker that compiled real kernels earlier may tell its own total meanwhile
    lines = [line for line in capfd.readouterr().err.splitlines() if "kernel_" in line or "compiled 20 " in line]
    assert len(lines) >= 3, lines
    done = [int(re.fullmatch(r"zinfer: compiling cpu-fast kernels: \d+ s, (\d+) done, now cpu_ops\.kernel_\d+",
                             line).group(1)) for line in lines[:-1]]
    assert done == sorted(done) and done[-1] > done[0]
    assert re.fullmatch(r"zinfer: compiled 20 cpu-fast kernels in \d+ s; later runs start from cache", lines[-1])
    progress.begin("cpu_tape.replay")
    time.sleep(0.5)
    assert not [line for line in capfd.readouterr().err.splitlines() if "cpu_tape" in line or "compiled 20 " in line]
    progress._at_exit()
    told = [line for line in capfd.readouterr().err.splitlines() if "compiled 20 " in line]
    assert len(told) == 1 and re.fullmatch(r"zinfer: compiled 20 cpu-fast kernels in \d+ s; "
                                           r"cpu_tape.replay finishes compiling in the background", told[0])
    progress.end()
    progress.told_total = True  # nothing more at pytest's exit
