"""Device choice and options: typed configs, `--device auto`, the CLI's device flags,
and clear errors for options of another device and tensor types a device cannot run."""

from __future__ import annotations

import msgspec
import numba
import pytest
import trio
from gguf import GGMLQuantizationType as QT

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.devices.config import CpuConfig, CpuFastConfig, CudaConfig, DeviceConfig
from zinfer.devices.registry import check_options, cuda_problem, make_device, resolve_device
from zinfer.gateway.cli import main, parser
from zinfer.gateway.cli_config import engine_config
from zinfer.traces.config import TraceConfig

try:
    from tests.tiny import write_tiny_gguf
except ImportError:  # before the move of models/tiny.py
    from zinfer.models.tiny import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", "llama", qtype=QT.Q8_0)


@pytest.fixture
def restore_numba_threads():
    yield
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: CpuFastConfig(threads=-1), "threads"),
        (lambda: CpuFastConfig(f32_cache_mib=-5), "f32_cache_mib"),
        (lambda: CudaConfig(gemm_dtype="f8"), "gemm_dtype"),
        (lambda: CudaConfig(matvec_max_tokens=0), "matvec_max_tokens"),
        (lambda: CudaConfig(graph_buckets=(1, 128)), "matvec_max_tokens"),
    ],
)
def test_bad_options_are_refused_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_decoded_options_are_validated_and_unknown_fields_refused():
    with pytest.raises(msgspec.ValidationError, match="threads"):
        msgspec.json.decode(b'{"kind": "cpu-fast", "threads": -2}', type=DeviceConfig)
    with pytest.raises(msgspec.ValidationError, match="thread"):
        msgspec.json.decode(b'{"kind": "cpu-fast", "thread": 2}', type=DeviceConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"kind": "tpu"}', type=DeviceConfig)


@pytest.mark.parametrize("options", [None, CpuConfig(),
                                     CpuFastConfig(threads=3, int8=False, kv_f16=False, f32_cache_mib=0),
                                     CudaConfig(cuda_graphs=True, graph_buckets=(1, 2))])
def test_engine_config_round_trips_with_device_options(options):
    """The ipc/tcp topologies send EngineConfig to their children as JSON."""
    config = EngineConfig(device="cpu-fast" if isinstance(options, CpuFastConfig) else "auto", device_options=options)
    assert msgspec.json.decode(msgspec.json.encode(config), type=EngineConfig) == config


def test_unknown_device_name_is_refused():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        EngineConfig(device="gpu")
    with pytest.raises(SystemExit) as info:
        main(["run", "--device", "cuda:x", "hi"])
    assert info.value.code == 1


@pytest.mark.skipif(cuda_problem() is None, reason="a GPU works here: auto picks cuda")
def test_auto_is_cpu_fast_here_and_says_why_not_cuda():
    picked = resolve_device("auto")
    assert picked.name == "cpu-fast"
    assert picked.reason.startswith("not cuda: ") and cuda_problem() in picked.reason


def test_default_device_is_auto():
    assert EngineConfig().device == "auto"
    assert parser().parse_args(["run", "hi"]).device == "auto"


def test_threads_flag_reaches_the_fast_device(restore_numba_threads):
    config = engine_config(parser().parse_args(["run", "--device", "cpu-fast", "--threads", "1", "--no-int8",
                                                "--kv-f32", "hi"]))
    assert config.device_options == CpuFastConfig(threads=1, int8=False, kv_f16=False)
    dev = make_device(config.device, config.device_options)
    assert (dev.threads, dev.int8, dev.kv_dtype.__name__) == (1, False, "float32")


def test_options_of_another_device_are_an_error():
    with pytest.raises(ValueError, match=r"cuda options \(cuda_graphs=True\) do not apply to device cpu-fast"):
        check_options("cpu-fast", CudaConfig(cuda_graphs=True))
    with pytest.raises(ValueError, match="cpu-fast options"):
        check_options("cuda:1", CpuFastConfig(threads=2))


def test_cuda_flag_with_cpu_fast_is_one_line_at_start(tiny_model, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--model", str(tiny_model), "--device", "cpu-fast", "--cuda-graphs", "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.count("\n") == 1 and "cuda" in err and "cpu-fast" in err and "Traceback" not in err


def test_cpu_and_cuda_flags_together_are_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--threads", "2", "--no-cuda-graphs", "hi"])
    assert info.value.code == 1
    assert "--threads" in capsys.readouterr().err


def test_engine_resolves_auto_and_traces_the_resolved_device(tiny_model, tmp_path, restore_numba_threads):
    async def main_():
        config = EngineConfig(model=str(tiny_model), device="auto", device_options=CpuFastConfig(threads=1),
                              trace=TraceConfig(dir=str(tmp_path)))
        async with open_engine(config) as engine:
            return (engine.config.device, engine.tracing.provider.resource.attributes["zinfer.device"],
                    engine.actors["executor"].device.threads)

    want = resolve_device("auto").name
    if want != "cpu-fast":
        pytest.skip(f"auto is {want} here")
    assert trio.run(main_) == ("cpu-fast", "cpu-fast", 1)


@pytest.mark.parametrize("device", ["cpu", "cpu-llama", "cpu-fast"])
def test_unsupported_tensor_type_is_one_line_naming_tensor_and_type(tmp_path, capsys, device):
    path = write_tiny_gguf(tmp_path / "iq.gguf", "llama", raw_types={"blk.0.ffn_up.weight": QT.IQ4_NL})
    with pytest.raises(SystemExit) as info:
        main(["run", "--model", str(path), "--device", device, "--max-tokens", "2", "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.count("\n") == 1 and "blk.0.ffn_up.weight" in err and "IQ4_NL" in err and "Traceback" not in err


@pytest.mark.skipif(cuda_problem() is None, reason="a GPU works here")
def test_cuda_by_name_without_a_gpu_is_one_line_before_loading(capsys):
    with pytest.raises(SystemExit) as info:
        # refused before the model is looked at
        main(["run", "--model", "/nonexistent.gguf", "--device", "cuda:0", "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert (err.startswith("zinfer: error: device cuda:0 cannot run here: ") and cuda_problem() in err
            and err.count("\n") == 1)
