"""A fuzz target for GGUF files: damaged headers, metadata and tensor bytes of tiny models
(tests/tiny.py), loaded as `zinfer run` loads them, with the invariants of issue 32:

- loading (open_model, the weights onto cpu and cpu-fast, the tokenizer from the metadata)
  either succeeds or raises ModelError, the one-line error every bad model gets; never
  another exception, never a native crash or a hang;
- a model whose tensor bytes were flipped and that still loads serves: each request ends
  with one terminal event (Finished, or Failed with a message such as "logits not
  finite"), and the engine answers the next request.

Each case runs in a worker process (`--worker`: a loop over cases read from stdin), so a
segfault ends that worker, is reported with the case, and a fresh worker takes the next.
tests/test_fuzz_gguf.py runs it in the slow tier; `python3 tests/fuzz_gguf.py --minutes 10`
runs it for that long and prints how many cases ran and how they ended.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
CASE_TIMEOUT = 120.0  # seconds for one case (a first cpu-fast compile included): longer is a hang
BASES = (("llama", "F32"), ("qwen2", "Q8_0"), ("gemma3", "Q5_0"), ("llama", "Q4_1"))
EXTREME_U64 = [0, 1, 2, 3, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1,
               2**62, 2**63 - 1, 2**63, 2**64 - 1]


# ---- base files and their layout ----------------------------------------------------------


class Base:
    """One whole tiny model: its bytes, where its header ends and where its tensors lie."""

    def __init__(self, path: Path):
        from zinfer.models.gguf_file import GGUFFile

        self.path = path
        self.blob = path.read_bytes()
        f = GGUFFile(path)
        self.spans = sorted((int(t.data.ctypes.data - f._map.ctypes.data), int(t.data.nbytes))
                            for t in f.tensors.values())
        self.header_end = self.spans[0][0]  # the data section starts at the first tensor


def make_bases(directory: Path) -> list[Base]:
    from gguf import GGMLQuantizationType as QT

    from tiny import write_tiny_gguf

    shape = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    return [Base(write_tiny_gguf(directory / f"{arch}-{q}.gguf", arch, qtype=QT[q], **shape)) for arch, q in BASES]


# ---- mutations (applied to a bytearray; positions taken modulo the region) ------------------


def _mutation(region: str) -> st.SearchStrategy:
    """One edit of the header ("header") or of the tensor data ("data") as a tuple."""
    pos = st.integers(0, 2**32)
    flips = st.tuples(st.just("flip"), st.just(region), pos, st.integers(1, 255))
    if region == "data":
        return st.one_of(
            flips,
            st.tuples(st.just("f16"), st.just(region), pos, st.sampled_from([0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0x0400])),
            # finite, but overflows
            st.tuples(st.just("f32"), st.just(region), pos, st.sampled_from([1e30, -3e38, 65504.0, 1e-40])),
        )
    return st.one_of(
        flips,
        st.tuples(st.just("u64"), st.just(region), pos, st.sampled_from(EXTREME_U64) | st.integers(0, 2**64 - 1)),
        st.tuples(st.just("u32"), st.just(region), pos, st.integers(0, 15) | st.sampled_from([2**31, 2**32 - 1])),
        st.tuples(st.just("insert"), st.just(region), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), st.just(region), pos, st.integers(1, 64)),
        st.tuples(st.just("truncate"), st.just("any"), pos, st.just(0)),
    )


def apply(base: Base, edits: list[tuple]) -> bytes:
    """base's bytes with the edits applied in order (positions wrap into their region)."""
    blob = bytearray(base.blob)
    for kind, region, pos, arg in edits:
        lo, hi = ((0, base.header_end) if region == "header"
                  else (base.header_end, len(blob)) if region == "data" else (0, len(blob)))
        at = lo + pos % max(1, hi - lo)
        if kind == "flip" and at < len(blob):
            blob[at] ^= arg
        elif kind == "f16":  # one quantized block's scale (or an f16 pair of any tensor) set to inf, NaN, ...
            at -= at % 2
            blob[at : at + 2] = struct.pack("<H", arg)
        elif kind == "f32":
            at -= at % 4
            blob[at : at + 4] = struct.pack("<f", arg)
        elif kind == "u64":
            blob[at : at + 8] = struct.pack("<Q", arg)
        elif kind == "u32":
            blob[at : at + 4] = struct.pack("<I", arg)
        elif kind == "insert":
            blob[at:at] = arg
        elif kind == "delete":
            del blob[at : at + arg]
        elif kind == "truncate":
            del blob[at:]
    return bytes(blob)


def header_cases(n_bases: int) -> st.SearchStrategy:
    """(base index, edits) damaging the header, sometimes the data too; or a file written
    from scratch with hostile nested metadata (base index -1, the depth)."""
    damaged = st.tuples(st.integers(0, n_bases - 1),
                        st.lists(_mutation("header") | _mutation("data"), min_size=1, max_size=4))
    nested = st.tuples(st.just(-1), st.integers(1, 20_000))
    return st.one_of(damaged, damaged, damaged, nested)


def data_cases(n_bases: int) -> st.SearchStrategy:
    """(base index, edits) flipping tensor bytes only: the header stays whole."""
    return st.tuples(st.integers(0, n_bases - 1), st.lists(_mutation("data"), min_size=1, max_size=6))


def case_file(bases: list[Base], case: tuple, directory: Path) -> Path:
    """Write the case's file; returns its path."""
    index, edits = case
    path = directory / "case.gguf"
    if index == -1:
        from gguf_corrupt import nested_metadata_gguf

        return nested_metadata_gguf(path, "general.nested", edits)
    path.write_bytes(apply(bases[index], edits))
    return path


# ---- the worker: one case per line of stdin, one JSON outcome per line of stdout ------------


def load_case(path: str) -> dict:
    """Load as `zinfer run` does, on cpu and cpu-fast: {"outcome": "loaded" | "refused" | "error", ...}."""
    from zinfer.devices.cpu import CpuDevice
    from zinfer.devices.cpu_fast import FastCpuDevice
    from zinfer.models.loader import open_model
    from zinfer.models.prompt import PromptBuilder
    from zinfer.models.spec import ModelError
    from zinfer.models.weights import build_weights

    try:
        src = open_model(path)
        for dev in (CpuDevice(), FastCpuDevice()):
            build_weights(src.spec, src.tensors, dev.upload)
        PromptBuilder.from_source(src)
    except ModelError as e:
        return {"outcome": "refused", "detail": str(e)}
    except Exception as e:  # the property: never anything but ModelError
        import traceback

        return {"outcome": "error", "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    return {"outcome": "loaded"}


def serve_case(path: str) -> dict:
    """Load; if the model loads, serve two greedy requests on cpu-fast in an in-process
    engine: {"outcome": "refused" | "served" | "failed-clean" | "error", ...}."""
    import trio

    from zinfer.actors.engine import EngineConfig, open_engine
    from zinfer.gateway.client import AsyncClient
    from zinfer.messages.client import TERMINAL_EVENTS, Failed, Finished
    from zinfer.messages.params import SamplingParams
    from zinfer.models.spec import ModelError

    async def run() -> dict:
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        ends = []
        async with (open_engine(EngineConfig(model=path, device="cpu-fast", max_running=4)) as engine,
                    AsyncClient(engine.ctx, engine.addrs.frontend) as client):
            with trio.fail_after(CASE_TIMEOUT / 2):
                for prompt in ("hello there", "the cat is"):
                    events = [ev async for ev in client.generate(prompt, params=params)]
                    terminals = [ev for ev in events if isinstance(ev, TERMINAL_EVENTS)]
                    if len(terminals) != 1 or not isinstance(terminals[0], (Finished, Failed)):
                        return {"outcome": "error", "detail": f"request {prompt!r} ended with {terminals}"}
                    ends.append(terminals[0])
        failed = [e.message for e in ends if isinstance(e, Failed)]
        return {"outcome": "failed-clean" if failed else "served", "detail": "; ".join(failed)}

    try:
        return trio.run(run)
    except ModelError as e:
        return {"outcome": "refused", "detail": str(e)}
    except BaseException as e:  # the property: the engine never raises out of a request
        import traceback

        return {"outcome": "error", "detail": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}


def worker() -> None:
    os.environ.setdefault("ZINFER_WEIGHT_CACHE", "0")
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only: stdout is the protocol
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to stderr
    for line in sys.stdin:
        mode, path = json.loads(line)
        result = load_case(path) if mode == "load" else serve_case(path)
        out.write(json.dumps(result) + "\n")
        out.flush()


class Worker:
    """The worker process, restarted after a crash or a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def run(self, mode: str, path: Path) -> dict:
        """One case's outcome; "crash" (the worker died: its exit status) or "hang"."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, __file__, "--worker"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, bufsize=1)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([mode, str(path)]) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        hung = not ready
        self.close()
        self.restarts += 1
        return {"outcome": "hang" if hung else "crash",
                "detail": f"worker exit status {self.proc.returncode if self.proc else None}"}

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


GOOD = {"load": {"loaded", "refused"}, "serve": {"refused", "served", "failed-clean"}}


def check(result: dict, mode: str, case: object) -> None:
    """Raise AssertionError naming the case when its outcome breaks the property."""
    assert result["outcome"] in GOOD[mode], (
        f"{mode} case {str(case)[:400]}: {result['outcome']}: {result.get('detail')}\n{result.get('traceback', '')}")


# ---- standalone: run for a while, print the counts -------------------------------------------


class TimeUp(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-share", type=float, default=0.1, help="fraction of the time spent on serve cases")
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    directory = Path(tempfile.mkdtemp(prefix="fuzz-gguf-"))
    bases = make_bases(directory)
    w = Worker()
    outcomes: Counter = Counter()
    failures: list[str] = []
    start = time.monotonic()

    def run_mode(mode: str, strategy: st.SearchStrategy, seconds: float) -> None:
        deadline = time.monotonic() + seconds

        @settings(max_examples=10**9, phases=[Phase.generate], **FUZZ)
        @given(case=strategy)
        def run(case):
            if time.monotonic() > deadline:
                raise TimeUp
            result = w.run(mode, case_file(bases, case, directory))
            outcomes[(mode, result["outcome"])] += 1
            try:
                check(result, mode, case)
            except AssertionError as e:
                failures.append(str(e))
                print(f"FAILURE: {str(e)[:2000]}", flush=True)

        try:
            run()
        except TimeUp:
            pass

    total = args.minutes * 60
    try:
        run_mode("load", header_cases(len(bases)), total * (1 - args.serve_share))
        run_mode("serve", data_cases(len(bases)), total - (time.monotonic() - start))
    finally:
        w.close()
    print(f"{sum(outcomes.values())} cases in {(time.monotonic() - start) / 60:.1f} min, "
          f"worker restarts {w.restarts}, failures {len(failures)}")
    for (mode, outcome), count in sorted(outcomes.items()):
        print(f"  {mode} {outcome}: {count}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
