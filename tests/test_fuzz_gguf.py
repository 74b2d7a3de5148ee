"""The GGUF fuzz target (tests/fuzz_gguf.py) in the slow tier: damaged headers, metadata
and tensor bytes either load or are refused with ModelError (never another exception, a
crash or a hang), and flipped tensor bytes in a model that still loads give clean
per-request outcomes with the engine alive. `python3 tests/fuzz_gguf.py --minutes 10`
runs the same target for longer."""

from __future__ import annotations

import pytest
from hypothesis import Phase, example, given, settings

import fuzz_gguf as fg


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return fg.make_bases(tmp_path_factory.mktemp("fuzz-gguf"))


@pytest.fixture(scope="module")
def worker():
    w = fg.Worker()
    yield w
    w.close()


@pytest.mark.slow  # ~1000 loads: ~10-20 s
@settings(max_examples=1000, phases=[Phase.explicit, Phase.generate], **fg.FUZZ)
@given(case=fg.header_cases(len(fg.BASES)))
@example(case=(-1, 5000))  # found: a 3,000-line RecursionError
@example(case=(0, [("u64", "header", 0, 2**64 - 1)]))
@example(case=(2, [("flip", "header", 146, 146)]))  # found: gemma3.block_count ~2^32, a hang building its layer pattern
# found: merges naming a missing token, the tokenizers library's bare Exception
@example(case=(0, [("flip", "header", 18703, 46)]))
def test_a_damaged_gguf_loads_or_is_refused_cleanly(bases, worker, tmp_path, case):
    result = worker.run("load", fg.case_file(bases, case, tmp_path))
    fg.check(result, "load", case)


@pytest.mark.slow  # ~50 engines: ~20-30 s
@settings(max_examples=50, phases=[Phase.explicit, Phase.generate], **fg.FUZZ)
@given(case=fg.data_cases(len(fg.BASES)))
@example(case=(1, [("f16", "data", 1000, 0x7C00)]))  # an inf block scale: refused at load
@example(case=(0, [("flip", "data", 4 * 70 + 3, 0x7F)]))  # an F32 exponent flipped
@example(case=(0, [("f32", "data", 4 * i, 1e30) for i in range(0, 4000, 97)]))  # huge but finite weights
def test_flipped_tensor_bytes_are_refused_or_fail_requests_cleanly(bases, worker, tmp_path, case):
    result = worker.run("serve", fg.case_file(bases, case, tmp_path))
    fg.check(result, "serve", case)
