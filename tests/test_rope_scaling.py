"""RoPE scaling (linear, YaRN, Llama 3 frequency factors) computes what llama.cpp computes.

The goldens (tests/goldens/rope_*.json, made by tests/goldens/rope_goldens.py) are
llama.cpp's logits and greedy ids on tiny random f32 models that scale RoPE, at
positions well past each model's original context. Here the same models are written
again (same seed and overrides) and run on the oracle, cpu-llama and cpu-fast. Scaling
that zinfer does not implement is refused at load with the key and value named.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny import tiny_config, write_tiny_gguf, write_tiny_hf
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuDevice
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.devices.cpu_llama import LlamaCpuDevice
from zinfer.devices.round import RoundCtx
from zinfer.kernels.llama_cpp import llama_ops as lo
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle import rope
from zinfer.kernels.tensor import TensorData
from zinfer.models.convert import convert_gguf_to_hf
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.spec import ModelError
from zinfer.models.spec_readers import spec_from_gguf, spec_from_hf_config
from zinfer.models.weights import build_weights

GOLDENS = sorted((Path(__file__).parent / "goldens").glob("rope_*.json"))
BLOCK, N_BLOCKS = 16, 16
# Of the largest of the golden logits. llama.cpp and zinfer sum in different orders (and
# llama.cpp builds angles by repeated multiplication): measured up to 7e-6 here. Gemma's
# GELU is a table of fp16 values in llama.cpp, exact in the oracle and cpu-fast: up to
# 1e-4 (cpu-llama, which uses the table: 1e-5). Wrong RoPE is far out: the same models
# without scaling miss by 6e-2 (gemma3, whose one scaled layer is half the model) to 1.
TOLERANCE = 3e-5
GEMMA_GELU_TOLERANCE = 2.5e-4
DEVICES = {
    "cpu": CpuDevice,
    "cpu-llama": LlamaCpuDevice,
    "cpu-fast": lambda: FastCpuDevice(kv_f16=False),
}
YARN = rope.scaling_as_llama_cpp("yarn", 4.0, 48)
LLAMA3 = rope.RopeScaling("linear", freq_factors=(1.0, 1.5, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0))


def run(path: Path, device, ids: list[int], cuts: list[int], n_greedy: int) -> tuple[dict[int, np.ndarray], list[int]]:
    """Prefill `ids` in chunks ending at each of `cuts` (logits there), then greedy decode:
    ({position: logits [vocab]}, greedy ids)."""
    src = open_model(path)
    spec, dev = src.spec, device()
    w = build_weights(spec, src.tensors, dev.upload)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, N_BLOCKS, BLOCK)
    table = list(range(N_BLOCKS))
    at, start = {}, 0
    for end in sorted(set(cuts) | {len(ids) - 1}):
        at[end] = round_logits(spec, w, dev, kv,
                               ForwardBatch.build([(ids[start : end + 1], start, table, True)], BLOCK))[0]
        start = end + 1
    greedy, logits = [], at[len(ids) - 1]
    for p in range(len(ids), len(ids) + n_greedy):
        greedy.append(int(np.argmax(logits)))
        logits = round_logits(spec, w, dev, kv, ForwardBatch.build([([greedy[-1]], p, table, True)], BLOCK))[0]
    return at, greedy


@pytest.fixture(scope="module")
def golden_models(tmp_path_factory) -> dict[str, tuple[dict, Path]]:
    """Each golden and its tiny model, written again from the golden's recipe (once per module)."""
    out = {}
    for golden in GOLDENS:
        g = json.loads(golden.read_text())
        out[golden.stem] = g, write_tiny_gguf(tmp_path_factory.mktemp("rope") / "m.gguf", g["arch"], seed=g["seed"],
                                              **g["overrides"])
    return out


# every golden on the oracle; the other devices on two each (between them every scaling
# and both rotations; their table code is checked against the oracle's on all below)
RUNS = [(p.stem, "cpu") for p in GOLDENS] + [
    ("rope_yarn-qwen2", "cpu-fast"), ("rope_llama3-freqs", "cpu-fast"),
    ("rope_yarn-llama", "cpu-llama"), ("rope_linear-gemma3", "cpu-llama"),
]


@pytest.mark.parametrize("golden, device", RUNS)
def test_scaled_rope_matches_llama_cpp(golden_models, golden, device):
    g, path = golden_models[golden]
    at, greedy = run(path, DEVICES[device], g["prompt_ids"], [t["position"] for t in g["top"]], len(g["greedy_ids"]))
    tolerance = GEMMA_GELU_TOLERANCE if g["arch"] == "gemma3" and device != "cpu-llama" else TOLERANCE
    for t in g["top"]:
        logits = at[t["position"]]
        assert int(np.argmax(logits)) == t["ids"][0]
        err = np.abs(logits[t["ids"]] - np.array(t["logits"], np.float32)).max()
        assert err < tolerance * np.abs(t["logits"]).max(), (t["position"], err)
    assert greedy == g["greedy_ids"]


def test_goldens_are_off_without_scaling(tmp_path):
    """The tolerance means something: the same networks without their scaling miss the
    goldens by far more (and with it, land inside)."""
    for golden in GOLDENS:
        g = json.loads(golden.read_text())
        overrides = {k: v for k, v in g["overrides"].items() if k != "rope_scaling"}
        path = write_tiny_gguf(tmp_path / f"{golden.stem}.gguf", g["arch"], seed=g["seed"], **overrides)
        last = g["top"][-1]
        at, _ = run(path, CpuDevice, g["prompt_ids"], [last["position"]], 0)
        err = np.abs(at[last["position"]][last["ids"]] - np.array(last["logits"], np.float32)).max()
        assert err > 100 * GEMMA_GELU_TOLERANCE * np.abs(last["logits"]).max(), golden.stem


def test_goldens_cover_every_scaling():
    kinds = {json.loads(p.read_text())["overrides"]["rope_scaling"]["rope_type"] for p in GOLDENS}
    assert kinds == {"linear", "yarn", "llama3"}


@pytest.mark.parametrize("arch, scaling", [
    ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}),
    ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 48}),
    ("gemma3", {"rope_type": "linear", "factor": 4.0}),
])
def test_config_json_rope_scaling_equals_the_converted_gguf(tmp_path, arch, scaling):
    """config.json's rope_scaling (HF semantics) gives the spec and logits of the GGUF
    file llama.cpp's converter makes from it."""
    hf = open_model(write_tiny_hf(tmp_path / "hf", arch, seed=5, rope_scaling=scaling))
    gg = open_model(write_tiny_gguf(tmp_path / "m.gguf", arch, seed=5, rope_scaling=scaling))
    assert hf.spec.rope_scaling == gg.spec.rope_scaling is not None
    assert hf.spec.rope_scaling_swa == gg.spec.rope_scaling_swa
    ids = list(range(2, 120))
    a, _ = run(hf.path, CpuDevice, ids, [], 0)
    b, _ = run(gg.path, CpuDevice, ids, [], 0)
    np.testing.assert_allclose(a[len(ids) - 1], b[len(ids) - 1], atol=1e-4)


def test_gemma3_scales_only_its_global_layers(tmp_path):
    spec = open_model(write_tiny_gguf(tmp_path / "m.gguf", "gemma3",
                                      rope_scaling={"rope_type": "linear", "factor": 4.0})).spec
    assert spec.layer_window(0) and not spec.layer_window(1)
    assert spec.layer_rope_scaling(0) is None
    assert spec.layer_rope_scaling(1).freq_scale == 0.25


def test_yarn_parameters_follow_llama_cpp():
    """llama-context.cpp: yarn_attn_factor = get_mscale(f) / (1 + 0.1 ln f), which the
    kernel's 1 + 0.1 ln f brings back; ext_factor 1; the ramp over corr dims [0, 2]."""
    assert (YARN.freq_scale, YARN.ext_factor, YARN.original_context) == (0.25, 1.0, 48)
    assert abs(YARN.attn_factor - 1.0) < 1e-6
    assert abs(rope.yarn_mscale(YARN) - (1 + 0.1 * np.log(4.0))) < 1e-6
    assert rope.yarn_corr_dims(16, 48, 10000.0, 32.0, 1.0) == (0.0, 2.0)
    inv, _ = rope.inv_freq(10000.0, 16, YARN)
    plain = rope.plain_inv_freq(10000.0, 16)
    np.testing.assert_allclose(inv[0], plain[0], rtol=1e-6)  # extrapolated: fast dims untouched
    np.testing.assert_allclose(inv[2:], plain[2:] / 4, rtol=1e-6)  # interpolated: slow dims / factor


@pytest.mark.parametrize("scaling", [YARN, LLAMA3, rope.scaling_as_llama_cpp("linear", 2.0, 0)],
                         ids=["yarn", "llama3", "linear"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_every_rope_path_agrees_with_the_oracle(scaling, interleaved):
    """llama_ops' exact float steps, cpu-fast's numba table and the array code the CUDA
    device runs (kernels/oracle/rope.py, here on numpy) against the oracle."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 16), dtype=np.float32)
    pos = np.array([0, 9, 100, 250])
    want = ref.rope(x, pos, 10000.0, 16, interleaved, scaling)
    assert np.abs(want - ref.rope(x, pos, 10000.0, 16, interleaved)).max() > 1e-2  # scaling changes something
    np.testing.assert_allclose(lo.rope(x, pos, 10000.0, 16, interleaved, scaling), want, atol=3e-5)
    dev = FastCpuDevice()
    ctx = dev.begin_round(ForwardBatch.build([([0], int(p), [0], False) for p in pos], 1024))
    np.testing.assert_allclose(dev.rope(x, ctx, 10000.0, 16, interleaved, scaling), want, atol=3e-5)
    cos, sin = rope.angles(np, pos, *rope.inv_freq(10000.0, 16, scaling))
    np.testing.assert_allclose(rope.rotate(np, x, cos, sin, interleaved), want, atol=3e-5)


def test_round_makes_each_table_once():
    batch = ForwardBatch.build([([0, 1, 2], 5, [0], True)], 16)
    ctx = RoundCtx(batch, batch.token_ids, batch.positions, batch.slots, batch.logits_rows)
    table = ctx.rope(10000.0, 16, YARN)
    assert ctx.rope(10000.0, 16, rope.scaling_as_llama_cpp("yarn", 4.0, 48)) is table
    assert ctx.rope(10000.0, 16) is not table
    assert ctx.rope(10000.0, 16, rope.RopeScaling()) is ctx.rope(10000.0, 16)  # identity scaling is plain RoPE


@pytest.mark.parametrize("metadata, named", [
    ({"llama.rope.scaling.type": "longrope"}, "llama.rope.scaling.type = 'longrope'"),
    ({"llama.rope.scaling.type": "dynamic"}, "llama.rope.scaling.type = 'dynamic'"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.yarn_beta_fast": 16.0},
     "llama.rope.scaling.yarn_beta_fast = 16.0"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.yarn_log_multiplier": 0.1},
     "llama.rope.scaling.yarn_log_multiplier"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.yarn_attn_factor": 1.0},
     "llama.rope.scaling.yarn_attn_factor = 1.0"),
    ({"llama.rope.scaling.wibble": 2.0}, "llama.rope.scaling.wibble = 2.0"),
    ({"llama.rope.scaling.factor": "eight"}, "llama.rope.scaling.factor = 'eight'"),
    ({"llama.rope.dimension_sections": "x"}, "llama.rope.dimension_sections"),
])
def test_unsupported_gguf_scaling_is_refused_naming_the_key(tmp_path, metadata, named):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", metadata=metadata)
    with pytest.raises(ModelError, match="^GGUF ") as info:
        open_model(path)
    assert named in str(info.value)


def test_rope_freqs_are_refused_where_llama_cpp_does_not_use_them(tmp_path):
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    # llama's rope_freqs tensor in a qwen2 file
    path = write_tiny_gguf(tmp_path / "q.gguf", "qwen2", rope_scaling=llama3)
    with pytest.raises(ModelError, match="'rope_freqs.weight' in a qwen2 model"):
        open_model(path)
    f = GGUFFile(write_tiny_gguf(tmp_path / "l.gguf", "llama", rope_scaling=llama3))
    good = f.tensors["rope_freqs.weight"]
    assert spec_from_gguf(f.metadata, tensors=f.tensors).rope_scaling.freq_factors[-1] == 8.0
    for bad in (TensorData(QT.F16, good.shape, np.asarray(good.data).astype(np.float16)),
                TensorData(QT.F32, (4,), good.data[:4])):
        with pytest.raises(ModelError, match="'rope_freqs.weight' must be F32 of shape"):
            spec_from_gguf(f.metadata, tensors={**f.tensors, "rope_freqs.weight": bad})
    negative = TensorData(QT.F32, good.shape, -np.asarray(good.data))
    with pytest.raises(ModelError, match="not positive finite"):
        spec_from_gguf(f.metadata, tensors={**f.tensors, "rope_freqs.weight": negative})


@pytest.mark.parametrize("scaling, named", [
    ({"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0], "long_factor": [2.0]}, "'longrope'"),
    ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic'"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": 0.707}, "'mscale' = 0.707"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16}, "'beta_fast' = 16"),
    ({"type": "linear"}, "'factor' must be a positive number"),
])
def test_unsupported_config_json_scaling_is_refused(tmp_path, scaling, named):
    with pytest.raises(ModelError, match="^config.json rope_scaling") as info:
        open_model(write_tiny_hf(tmp_path / "hf", "qwen2", rope_scaling=scaling))
    assert named in str(info.value)


def test_llama3_scaling_on_qwen2_config_is_refused(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    with pytest.raises(ModelError, match="llama3 scaling on a qwen2 model"):
        open_model(write_tiny_hf(tmp_path / "hf", "qwen2", rope_scaling=scaling))


def test_transformers_5_rope_parameters_are_read():
    config = {k: v for k, v in tiny_config("qwen2").items() if k != "rope_theta"}
    spec = spec_from_hf_config({**config, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})
    assert spec.rope_base == 500000.0 and spec.rope_scaling is None
    yarn = {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 48}
    assert spec_from_hf_config({**config, "rope_parameters": yarn}).rope_scaling == YARN


def test_convert_refuses_a_scaled_model_rather_than_drop_its_scaling(tmp_path):
    """convert_gguf_to_hf skips rope_freqs.weight and wrote no rope_scaling: the HF copy of
    a Llama 3 file would have run plain RoPE."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", rope_scaling=llama3)
    with pytest.raises(ModelError, match="RoPE scaling"):
        convert_gguf_to_hf(path, tmp_path / "hf")
