"""A device's uploaded weights cached on disk, so a warm start skips the repack.

cpu-fast repacks GGUF blocks into its kernels' layouts at upload (seconds for a large
model, and transient copies that set the peak RSS). The first load of a model writes
every uploaded weight with pickle protocol 5, its arrays out of band into one data file
(64-byte aligned); later loads map that file copy-on-write and rebuild each weight over
views of the map: no repack, no copy, and pages come in as the kernels first read them.

An entry lives under ~/.cache/zinfer/weights/<key>, key = hash of the model file (size,
mtime and its first and last MiB), the device and its options, the CPU's flags, numpy's
version and the source of this module and every kernels/ and devices/ module (any edit
there starts a fresh entry). It caches data, not code, so it keeps its own key: compiled
kernels are cached under kernels/cpu_fast/code_cache.py's.
Only model files of at least MIN_FILE_BYTES are cached (tiny test models never are) and
the KEEP most recently used entries are kept. ZINFER_WEIGHT_CACHE=0 turns it off.
Any failure to read or write the cache falls back to uploading, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import platformdirs
import structlog

from zinfer.kernels.tensor import TensorData
from zinfer.models.weights import build_weights

log = structlog.get_logger("zinfer.weight_cache")

MIN_FILE_BYTES = 64 << 20
KEEP = 3  # entries kept (each about the size of the model's repacked weights)
CACHED_DEVICES = ("cpu-fast",)  # devices whose upload repacks (the others copy or dequantize)
_ALIGN = 64
_INDEX, _DATA = "index.pkl", "data.bin"

Upload = Callable[[str, TensorData], Any]


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("zinfer")) / "weights"


def entry_key(model_path: Path, device: Any) -> str:
    """The cache key of (this model file, this device with its options, this code)."""
    st = model_path.stat()
    what = f"{st.st_size}|{st.st_mtime_ns}|{np.__version__}|{device.name}|{_device_options(device)}"
    digest = hashlib.sha256(what.encode())
    with open(model_path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, st.st_size - (1 << 20)))
        digest.update(f.read(1 << 20))
    digest.update(_cpu_flags().encode())
    root = Path(__file__).resolve().parent.parent
    code = [*sorted((root / "kernels").rglob("*.py")), *sorted((root / "devices").rglob("*.py"))]
    for path in [Path(__file__).resolve(), *code]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _cpu_flags() -> str:
    """The CPU's feature flags (the kernels' layouts follow them), "" where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _device_options(device: Any) -> str:
    """What besides the code decides what upload makes: the device's plain settings (not
    its thread count) and the bytes its f32 budget allows."""
    plain = sorted((k, v) for k, v in vars(device).items() if isinstance(v, (bool, int, float, str)) and k != "threads")
    budget = getattr(getattr(device, "f32_budget", None), "left", None)
    return repr((plain, budget))


class WeightCache:
    """One model's weights for one device: `upload` serves them from the cache when the
    entry exists, else uploads and records; `finish()` publishes a recorded entry."""

    def __init__(self, model_path: Path, device: Any, upload: Upload, root: Path | None = None):
        self.upload_fn, self.hits, self.misses = upload, 0, 0
        self.root = root or cache_root()
        self.dir = self.root / entry_key(model_path, device)
        self._index: dict[str, tuple[bytes, list[tuple[int, int]]]] = {}
        self._map: np.memmap | None = None
        self._writer: _Writer | None = None
        if (self.dir / _INDEX).exists():
            try:
                with open(self.dir / _INDEX, "rb") as f:
                    self._index = pickle.load(f)
                self._map = np.memmap(self.dir / _DATA, mode="c") if (self.dir / _DATA).stat().st_size else None
                os.utime(self.dir)  # most recently used
            except Exception as exc:
                log.warning("weight cache unreadable, uploading instead", dir=str(self.dir), error=str(exc))
                self._index, self._map = {}, None
        if not self._index:
            try:
                self._writer = _Writer(self.root)
            except OSError as exc:
                log.warning("weight cache not writable", dir=str(self.root), error=str(exc))

    def upload(self, name: str, tensor: TensorData) -> Any:
        """The device's weight for tensor `name`: rebuilt over the cache's map, or uploaded (and recorded)."""
        if name in self._index:
            blob, spans = self._index[name]
            view = self._map.data if self._map is not None else memoryview(b"")
            self.hits += 1
            return pickle.loads(blob, buffers=[view[o:o + n] for o, n in spans])
        self.misses += 1
        result = self.upload_fn(name, tensor)
        if self._writer is not None:
            try:
                self._writer.add(name, result)
            except Exception as exc:  # an unpicklable weight, a full disk: no entry this time
                log.warning("weight cache not written", error=str(exc))
                self._writer.abandon()
                self._writer = None
        return result

    def finish(self) -> None:
        """Publish the recorded entry (if this load recorded one) and drop the oldest entries past KEEP."""
        if self._writer is None:
            return
        try:
            self._writer.publish(self.dir)
            log.info("weight cache written", dir=str(self.dir), tensors=self.misses)
        except OSError as exc:
            log.warning("weight cache not written", error=str(exc))
            self._writer.abandon()
        self._writer = None
        entries = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        # left by a writer that died
        stale = [p for p in self.root.glob(".tmp-*") if time.time() - p.stat().st_mtime > 3600]
        for old in entries[KEEP:] + stale:
            shutil.rmtree(old, ignore_errors=True)


class _Writer:
    """A new entry being written in a temporary folder under root (renamed into place by publish)."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        self.data: BinaryIO = open(self.tmp / _DATA, "wb")
        self.index: dict[str, tuple[bytes, list[tuple[int, int]]]] = {}

    def add(self, name: str, weight: Any) -> None:
        """Append weight's arrays to the data file and its pickle (which names them by span) to the index."""
        buffers: list[pickle.PickleBuffer] = []
        blob = pickle.dumps(weight, protocol=5, buffer_callback=buffers.append)
        spans = []
        for buf in buffers:
            raw = buf.raw()
            pad = -self.data.tell() % _ALIGN
            self.data.write(b"\0" * pad)
            spans.append((self.data.tell(), raw.nbytes))
            self.data.write(raw)
        self.index[name] = (blob, spans)

    def publish(self, target: Path) -> None:
        self.data.close()
        with open(self.tmp / _INDEX, "wb") as f:
            pickle.dump(self.index, f, protocol=5)
        try:
            os.rename(self.tmp, target)
        except OSError:
            if not (target / _INDEX).exists():
                raise
            shutil.rmtree(self.tmp, ignore_errors=True)  # another process published the same entry first

    def abandon(self) -> None:
        self.data.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def build_device_weights(source: Any, device: Any) -> Any:
    """source's weights on device (models.weights.build_weights), through the weight cache
    where it applies, and with the file pages the device copied dropped from RSS."""
    upload = source.uploader(device.upload)
    use = (os.environ.get("ZINFER_WEIGHT_CACHE", "1") != "0" and getattr(device, "name", "") in CACHED_DEVICES
           and source.format == "gguf" and source.path.stat().st_size >= MIN_FILE_BYTES)
    if not use:
        return build_weights(source.spec, source.tensors, upload)
    started = time.perf_counter()
    cache = WeightCache(source.path, device, upload)
    weights = build_weights(source.spec, source.tensors, cache.upload)
    cache.finish()
    log.info("weights", cached=cache.hits, uploaded=cache.misses, seconds=round(time.perf_counter() - started, 2))
    return weights
