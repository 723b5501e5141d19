"""`edgeprefill build`: what it checks on any machine, and how it fails without TensorRT."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import onnx
import pytest
from click.testing import CliRunner

from edgeprefill.cli.main import cli
from edgeprefill.engines.trt import build as trt_build
from edgeprefill.engines.trt.build import (
    BuildOptions,
    NetworkTyping,
    network_typing,
    prepare_build,
)
from edgeprefill.errors import BackendError

NO_TENSORRT = importlib.util.find_spec("tensorrt") is None


def edgeprefill(*args: str) -> subprocess.CompletedProcess:
    """The console entry point, as a user runs it."""
    code = "from edgeprefill.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(not NO_TENSORRT, reason="TensorRT is installed here")
def test_build_without_tensorrt_prints_one_line_saying_what_to_install(bundle):
    done = edgeprefill("build", str(bundle("llama", "standard")))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("error: TensorRT is not installed")
    assert "edgeprefill[tensorrt-cu12]\" --extra-index-url https://pypi.nvidia.com" in lines[0]
    assert "JetPack" in lines[0]


def test_build_refuses_an_ort_flavour_bundle_before_looking_for_tensorrt(bundle):
    done = edgeprefill("build", str(bundle("llama", "ort")))
    assert done.returncode == 2
    assert "re-export it with `edgeprefill export ... --flavor standard`" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_build_help_lists_its_options():
    result = CliRunner().invoke(cli, ["build", "--help"])
    assert result.exit_code == 0
    for option in ("--precision", "--workspace", "--max-batch", "--capacity", "--force"):
        assert option in result.output


def test_prepare_build_plans_profiles_and_hands_the_parser_a_static_graph(bundle):
    bundle_dir = bundle("llama", "standard")
    inputs = prepare_build(bundle_dir, BuildOptions(precision="fp32", capacity=128))
    assert [p.name for p in inputs.plan.profiles] == ["prefill-16", "prefill-64", "decode"]
    assert inputs.plan.capacity == 128 and inputs.plan.max_batch == 8
    assert inputs.typing == NetworkTyping(strongly_typed=True, builder_flags=())
    assert inputs.graph_path == (bundle_dir / "model.onnx").resolve()
    graph = onnx.load_from_string(inputs.graph)
    kv = next(v for v in graph.graph.input if v.name == "past_key.0")
    assert kv.type.tensor_type.shape.dim[2].dim_value == 128


@pytest.mark.parametrize("options,message", [
    (BuildOptions(precision="int8"), "QuantizeLinear/DequantizeLinear"),
    (BuildOptions(capacity=4096), "KV capacity must be in 2..512"),
    (BuildOptions(max_batch=0), "--max-batch must be at least 1"),
])
def test_prepare_build_refuses_what_cannot_be_built(bundle, options, message):
    with pytest.raises(BackendError, match=message.replace(".", r"\.")):
        prepare_build(bundle("llama", "standard"), options)


def test_network_typing_follows_the_bundle_dtype():
    assert network_typing("float16", "fp16", False) == NetworkTyping(True, ())
    assert network_typing("float32", "fp32", False) == NetworkTyping(True, ())
    assert network_typing("float32", "int8", True) == NetworkTyping(True, ())
    with pytest.raises(BackendError, match="weights are float16"):
        network_typing("float16", "fp32", False)
    assert network_typing("float16", "fp16", False, weak_typing=False) == NetworkTyping(True, ())


@pytest.mark.parametrize("dtype, own", [("float32", "fp32"), ("float16", "fp16")])
def test_int8_without_qdq_nodes_advises_the_bundles_own_precision(dtype, own):
    """The advice is a build that works: a float32 bundle's fp16 is refused too (it had
    advised fp16 whatever the bundle, and that refusal then advised fp32)."""
    with pytest.raises(BackendError, match=f"build with --precision {own},"):
        network_typing(dtype, "int8", False)
    assert network_typing(dtype, own, False) == NetworkTyping(True, ())


@pytest.mark.parametrize("weak", [True, False])
def test_a_float32_bundle_at_fp16_is_refused_to_keep_its_kv_cache_in_place(weak):
    with pytest.raises(BackendError) as err:
        network_typing("float32", "fp16", False, weak_typing=weak)
    message = str(err.value)
    assert "build with --precision fp32, or re-export with --dtype fp16" in message
    assert "in place" in message and "\n" not in message


def test_the_default_precision_is_the_bundles_and_fp16_of_float32_is_refused(bundle):
    inputs = prepare_build(bundle("llama", "standard"), BuildOptions(capacity=128))
    assert inputs.precision == "fp32"  # the test bundles are float32
    with pytest.raises(BackendError, match="float32 bundle builds at fp32 only"):
        prepare_build(bundle("llama", "standard"), BuildOptions(precision="fp16"))


def test_build_options_are_checked():
    with pytest.raises(BackendError, match="unknown precision"):
        BuildOptions(precision="bf16")
    with pytest.raises(BackendError, match="--workspace"):
        BuildOptions(workspace_mib=0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """TensorRT 10.15 on an 'Orin' whose builder returns fixed bytes: the build's caching
    logic runs, the compiler is the only thing faked."""
    built = []


    def compile_engine(trt, inputs, options, echo):
        built.append(inputs)
        return b"engine:" + inputs.typing.builder_flags.__repr__().encode()

    monkeypatch.setattr(trt_build, "require_tensorrt", lambda: SimpleNamespace(
        __version__="10.15.1.29"))
    monkeypatch.setattr(trt_build, "device_info", lambda: ("Orin", "8.7"))
    monkeypatch.setattr(trt_build, "compile_engine", compile_engine)
    return built


def test_build_caches_the_engine_and_reuses_it_until_forced(bundle, tmp_path, fake_gpu):
    bundle_dir = tmp_path / "bundle"
    shutil.copytree(bundle("llama", "standard"), bundle_dir)
    runner = CliRunner()
    first = runner.invoke(cli, ["build", str(bundle_dir), "--capacity", "128"])
    assert first.exit_code == 0, first.output
    assert "profiles: prefill-16, prefill-64, decode" in first.output
    assert re.search(r"built .*orin-sm87-trt10\.15\.1\.29-fp32-\w+\.engine in [\d.]+ s",
                     first.output)
    again = runner.invoke(cli, ["build", str(bundle_dir), "--capacity", "128"])
    assert "engine up to date" in again.output and len(fake_gpu) == 1
    forced = runner.invoke(cli, ["build", str(bundle_dir), "--capacity", "128", "--force"])
    assert "built" in forced.output and len(fake_gpu) == 2
    other = runner.invoke(cli, ["build", str(bundle_dir), "--capacity", "256"])
    assert "built" in other.output and len(fake_gpu) == 3  # another plan, another engine
    assert len(list((bundle_dir / "engines").glob("*.engine"))) == 2

