"""Start-up: the GGUF header read without gguf-py's per-value views, the KV pool sized
from --max-running and --max-model-len, and what a user sees when a request cannot fit."""

from __future__ import annotations

import os
import pickle
import re

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny import write_tiny_gguf
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.registry import make_device
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.cli import parser
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.cli_config import engine_config
from zinfer.messages.client import Delta, Finished, Rejected
from zinfer.messages.params import SamplingParams
from zinfer.models import vocab_cache
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.loader import open_model
from zinfer.models.tokenizer import Tokenizer
from zinfer.models.weight_cache import WeightCache
from zinfer.models.weights import build_weights


def reader_view(path) -> tuple[dict, dict]:
    """(metadata, name -> (qtype, shape, dtype, data shape, file offset)) as gguf.GGUFReader reads them."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (QT(t.tensor_type), tuple(int(d) for d in reversed(t.shape.tolist())), t.data.dtype,
                        t.data.shape, int(t.data_offset))
               for t in r.tensors}
    return meta, tensors


def assert_same_as_reader(path) -> GGUFFile:
    f = GGUFFile(path)
    meta, tensors = reader_view(path)
    assert f.metadata.keys() == meta.keys()
    for key, value in meta.items():
        assert f.metadata[key] == value and type(f.metadata[key]) is type(value), key
    assert f.tensors.keys() == tensors.keys()
    base = f._map.ctypes.data
    for name, t in f.tensors.items():
        assert (t.qtype, t.shape, t.data.dtype, t.data.shape, t.data.ctypes.data - base) == tensors[name], name
        assert np.shares_memory(t.data, f._map), f"{name} was copied out of the memory map"
    return f


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q8_0, QT.Q4_0])
def test_header_reads_as_gguf_py_reads_it(tmp_path, qtype):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_bool("test.flag", True)
    writer.add_float32("test.f32", 0.1)
    writer.add_float64("test.f64", 0.1)
    writer.add_int64("test.i64", -5)
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, 0.25])
    writer.add_array("test.texts", ["a", "", "ü 日本"])
    writer.add_string("test.empty", "")
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    writer.add_tensor("h", np.ones(32, np.float16))
    writer.add_tensor("q", gguf.quants.quantize(np.ones((3, 64), np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = assert_same_as_reader(path)
    assert f.metadata["test.texts"] == ["a", "", "ü 日本"]
    assert f.tensors["w"].data[1, 31] == 63.0


def test_tiny_model_vocabulary_encodes_token_for_token_as_before(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=QT.Q8_0)
    f = assert_same_as_reader(path)
    old = Tokenizer.from_gguf_metadata(reader_view(path)[0])
    new = Tokenizer.from_gguf_metadata(f.metadata)
    text = "Hello wörld, 123 <|im_start|>  tabs\tand\nlines 日本"
    assert new.encode(text) == old.encode(text) and len(new.encode(text)) > 10
    assert new.vocab_size == old.vocab_size
    assert [new.token_bytes(i) for i in range(new.vocab_size)] == [old.token_bytes(i) for i in range(old.vocab_size)]


@pytest.mark.slow
def test_real_vocabulary_reads_as_gguf_py_reads_it(smollm2_path):
    f = assert_same_as_reader(smollm2_path)
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152


# ---- the KV pool ----------------------------------------------------------------------

def pool_bytes(engine) -> int:
    """Bytes of K and V the executor allocated (every layer)."""
    kv = engine.engine.actors["executor"].kv
    return sum(a.nbytes for a in (*kv.k, *kv.v))


@pytest.fixture(scope="module")
def tiny_long_context(tmp_path_factory):
    """A tiny llama with a 4096-token context (its KV: 2 layers x 2 heads x 16 dims)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=4096)


@pytest.mark.parametrize(("max_running", "max_model_len", "blocks"),
                         [(1, 4096, 256), (4, 512, 128), (3, 4096, 256), (32, 0, 2048)])
def test_pool_is_sized_from_max_running_and_max_model_len(tiny_long_context, max_running, max_model_len, blocks):
    with EngineThread(EngineConfig(model=str(tiny_long_context), device="cpu", max_running=max_running,
                                   max_model_len=max_model_len)) as e:
        assert e.engine.actors["kv"].allocator.num_blocks == blocks
        assert pool_bytes(e) == 2 * 2 * blocks * 16 * 2 * 16 * 4  # K and V, layers, slots, heads, dims, f32


def test_zinfer_run_reserves_one_sequence_not_thirty_two(tiny_long_context):
    args = parser().parse_args(["run", "--model", str(tiny_long_context), "hi"])
    assert args.max_running == 1
    sched = engine_config(args).scheduler_config(open_model(tiny_long_context))
    assert sched.num_blocks * sched.block_size == 4096  # was 32 x 1024 tokens
    assert parser().parse_args(["serve"]).max_running == 32


@pytest.fixture
def four_block_engine(tiny_long_context):
    """An engine whose pool (--num-blocks 4: 64 tokens) is far shorter than its 4096-token context."""
    with EngineThread(EngineConfig(model=str(tiny_long_context), device="cpu", max_running=2, num_blocks=4)) as e:
        yield e


async def test_request_too_long_for_the_pool_is_refused_and_the_engine_serves_on(four_block_engine):
    e = four_block_engine
    async with AsyncClient(e.ctx, e.address) as client:
        long = [ev async for ev in client.generate("word " * 100, params=SamplingParams(max_tokens=2))]
        assert isinstance(long[-1], Rejected) and long[-1].code == "cannot_fit"
        assert "4 of 16" in long[-1].message
        short = [ev async for ev in client.generate("hi", params=SamplingParams(temperature=0, max_tokens=3,
                                                                                 ignore_eos=True))]
        assert isinstance(short[-1], Finished) and sum(len(ev.token_ids) for ev in short if isinstance(ev, Delta)) == 3
    e.engine.actors["kv"].allocator.check_invariants()


# ---- file pages after upload ------------------------------------------------------------

def mapped_rss_kib(path) -> int:
    """KiB of `path`'s memory maps resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header: address range ... path
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_file_pages_a_device_copied_leave_memory_and_its_weights_stay_right(tmp_path):
    # ~3 MiB of Q8_0 matrices
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=QT.Q8_0, intermediate_size=8192)
    source = open_model(path)
    for t in source.tensors.values():
        np.asarray(t.data).sum()  # read every byte: all pages resident
    before = mapped_rss_kib(path)
    weights = build_weights(source.spec, source.tensors, source.uploader(CpuDevice().upload))
    after = mapped_rss_kib(path)
    assert before > 2048 and after < before / 4, (before, after)
    fresh = build_weights(source.spec, open_model(path).tensors, CpuDevice().upload)
    assert np.array_equal(weights.layers[1].w_up, fresh.layers[1].w_up)  # the released bytes read back the same


# ---- repacked weights cached on disk ------------------------------------------------------

def same_weight(a, b) -> bool:
    """Whether two uploaded weights are the same: types, every field, every array's dtype, shape and bytes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_weight(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__"):
        return vars(a).keys() == vars(b).keys() and all(same_weight(v, vars(b)[k]) for k, v in vars(a).items())
    return a == b


def cached_weights(path, root, device):
    source = open_model(path)
    cache = WeightCache(source.path, device, source.uploader(device.upload), root=root)
    weights = {name: cache.upload(name, t) for name, t in source.tensors.items()}
    cache.finish()
    return weights, cache


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q5_0])
def test_a_warm_load_rebuilds_the_same_weights_from_the_cache_without_uploading(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=qtype, hidden_size=256, intermediate_size=512)
    device = make_device("cpu-fast", None)
    first, cache = cached_weights(path, tmp_path / "cache", device)
    assert cache.hits == 0 and cache.misses == len(first)
    warm, cache = cached_weights(path, tmp_path / "cache", device)
    assert cache.hits == len(first) and cache.misses == 0
    for name in first:
        assert same_weight(warm[name], first[name]), name
    assert any(not isinstance(w, np.ndarray) for w in warm.values())  # packed matrices among them
    os.utime(path, ns=(1, 1))  # the file changed: a new entry
    _, cache = cached_weights(path, tmp_path / "cache", device)
    assert cache.hits == 0 and len(list((tmp_path / "cache").iterdir())) == 2


def _followed_by_nan(weight):
    """weight through pickle protocol 5 as the cache stores it, each array now followed in
    memory by NaN bytes (in the cache's data file, the next array's bytes follow)."""
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(weight, protocol=5, buffer_callback=buffers.append)
    views = []
    for buf in buffers:
        raw = buf.raw()
        room = bytearray(b"\xff" * (raw.nbytes + 256))
        room[: raw.nbytes] = raw
        views.append(memoryview(room)[: raw.nbytes])
    return pickle.loads(blob, buffers=views)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0])
def test_cached_matrices_compute_what_uploaded_ones_do(tmp_path, qtype):
    """A stored matrix's products equal the uploaded one's whatever bytes follow its arrays:
    the kernels read past a row's last block (u4's offsets: whole vectors of 8), so what they
    read must be inside the arrays the cache keeps. 320 columns: 10 blocks, 6 read past."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=qtype, hidden_size=320, intermediate_size=640)
    device = make_device("cpu-fast", None)
    source = open_model(path)
    x = np.random.default_rng(0).standard_normal((3, 320)).astype(np.float32)  # [T, hidden]
    checked = 0
    for name, tensor in source.tensors.items():
        w = device.upload(name, tensor)
        if not isinstance(w, np.ndarray) and w.shape[1] == 320:
            assert np.array_equal(_followed_by_nan(w).compute(x), w.compute(x)), name
            checked += 1
    assert checked


def test_an_unreadable_entry_falls_back_to_uploading(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=QT.Q8_0)
    device = make_device("cpu-fast", None)
    first, _ = cached_weights(path, tmp_path / "cache", device)
    (entry,) = (tmp_path / "cache").iterdir()
    (entry / "index.pkl").write_bytes(b"not a pickle")
    again, cache = cached_weights(path, tmp_path / "cache", device)
    assert cache.hits == 0 and cache.misses == len(first) == len(again)


# ---- the tokenizer.json of a GGUF vocabulary, cached on disk -------------------------------

def test_a_cached_vocabulary_gives_the_same_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab_cache, "MIN_TOKENS", 0)  # the tiny vocabulary is cached too
    monkeypatch.setattr(vocab_cache, "cache_root", lambda: tmp_path / "tok")
    meta = GGUFFile(write_tiny_gguf(tmp_path / "m.gguf", "qwen2")).metadata
    built = vocab_cache._build(meta)
    assert vocab_cache.tokenizer_json(meta) == built and len(list((tmp_path / "tok").glob("*.json"))) == 1
    (entry,) = (tmp_path / "tok").glob("*.json")
    # a readable entry, now of another text
    entry.write_text(entry.read_text().replace('"tokenizer": "', '"tokenizer": "{}" , "x": "'))
    assert vocab_cache.tokenizer_json(meta)[0] == "{}"  # read from the file, not rebuilt
    entry.write_text("{ truncated")
    assert vocab_cache.tokenizer_json(meta) == built  # unreadable: built again (and stored)
    cached = Tokenizer.from_gguf_metadata(meta)
    monkeypatch.setenv("ZINFER_VOCAB_CACHE", "0")
    fresh = Tokenizer.from_gguf_metadata(meta)
    text = "Hello wörld <|im_start|> 12 日本"
    assert (cached.encode(text) == fresh.encode(text)
            and cached.decode(cached.encode(text)) == fresh.decode(fresh.encode(text)))
    other = {**meta, "tokenizer.ggml.merges": meta["tokenizer.ggml.merges"][:-1]}
    assert vocab_cache._key(other) != vocab_cache._key(meta)
