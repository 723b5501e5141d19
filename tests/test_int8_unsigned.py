"""On an x86 CPU without VNNI, DynamicQuantizeMatMul's int8 weights go to the session as
uint8 at a zero point of 128 (engines/ort/int8_unsigned.py): the same numbers, without the
saturating int16 sums of ONNX Runtime's uint8 x int8 GEMM there."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.contract import LOGITS
from edgeprefill.engines.ort import int8_unsigned
from edgeprefill.errors import BackendError
from edgeprefill.export.quantize import QuantConfig
from tests.test_quantize import ExportOptions, export, logits_at

K, N, M = 576, 1536, 64  # SmolLM2-135M's up projection, a 64-token chunk


def flags(monkeypatch, text: str, machine: str = "x86_64") -> None:
    monkeypatch.setattr(int8_unsigned, "cpu_identity", lambda: f"model name\t: X\nflags\t: {text}")
    monkeypatch.setattr(int8_unsigned.platform, "machine", lambda: machine)


@pytest.mark.parametrize("cpu_flags, machine, saturating", [
    ("sse4_2 avx avx2 fma", "x86_64", True),            # Zen 1-3, Skylake client
    ("avx2 avx512f avx512bw", "x86_64", True),          # Skylake-SP: AVX-512 without VNNI
    ("avx2 avx512f avx512bw avx512_vnni", "x86_64", False),  # Zen 4/5, Ice Lake, Cascade Lake
    ("avx2 avx_vnni", "x86_64", False),                 # Alder Lake client
    ("avx2 amx_int8 amx_tile", "x86_64", False),
    ("fp asimd asimddp", "aarch64", False),             # Arm: dot products widen first
])
def test_which_cpus_saturate(monkeypatch, cpu_flags, machine, saturating):
    monkeypatch.delenv(int8_unsigned.MODE_ENV, raising=False)
    flags(monkeypatch, cpu_flags, machine)
    assert int8_unsigned.saturates() is saturating


def test_the_environment_decides_when_set(monkeypatch):
    flags(monkeypatch, "avx2")
    monkeypatch.setenv(int8_unsigned.MODE_ENV, "off")
    assert not int8_unsigned.saturates()
    flags(monkeypatch, "avx2 avx512_vnni")
    monkeypatch.setenv(int8_unsigned.MODE_ENV, "on")
    assert int8_unsigned.saturates()
    monkeypatch.setenv(int8_unsigned.MODE_ENV, "sometimes")
    with pytest.raises(BackendError, match=r"EDGEPREFILL_INT8_UNSIGNED='sometimes': choose "
                                           r"one of auto, on, off"):
        int8_unsigned.saturates()


def test_uint8_codes_are_the_same_numbers():
    codes = np.arange(-128, 128, dtype=np.int8).reshape(16, 16).T  # transposed, as derived
    u = int8_unsigned.unsigned(codes)
    assert u.dtype == np.uint8 and u.flags.c_contiguous
    np.testing.assert_array_equal(u.astype(np.int16) - int8_unsigned.ZERO_POINT, codes)


def one_projection(tmp_path, monkeypatch, mode: str):
    """A graph of one DynamicQuantizeMatMul on int8 codes, rewritten (or not) as the backend
    does, and its session; with its inputs: activations, codes, scales."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    codes = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    node = helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s"], ["y"],
                            domain="com.microsoft")
    graph = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, N])],
        [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(scale, "s")]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    graph.ir_version = 9
    monkeypatch.setenv(int8_unsigned.MODE_ENV, mode)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    done = int8_unsigned.choose(graph, tmp_path, options)
    session = ort.InferenceSession(graph.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return done, session, (x, codes, scale)


def emulated(x: np.ndarray, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What DynamicQuantizeMatMul computes: activations quantized to uint8 per tensor
    (asymmetric, 0 included), exact integer products, scaled back."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    step = (high - low) / 255
    zero = np.clip(np.round(-low / step), 0, 255)
    q = np.clip(np.round(x / step) + zero, 0, 255)
    return ((q - zero) @ codes.astype(np.float64)) * step * scale


def test_the_rewritten_projection_computes_the_codes_exactly(tmp_path, monkeypatch):
    """On every CPU the uint8 weights give the integer products of the int8 codes. (Where
    ONNX Runtime's int8 GEMM saturates, a Zen 3, the int8 weights gave 8.3% of the
    result's scale off this.)"""
    done, session, (x, codes, scale) = one_projection(tmp_path, monkeypatch, "on")
    assert done.rewritten == 1
    assert done.described == "1 int8 projection on uint8 weights (EDGEPREFILL_INT8_UNSIGNED=on)"
    want = emulated(x, codes, scale)
    got = session.run(None, {"x": x})[0]
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-6


def test_off_keeps_the_bundles_node(tmp_path, monkeypatch):
    done, session, _ = one_projection(tmp_path, monkeypatch, "off")
    assert done.rewritten == 0 and done.described == ""


def test_an_int8_bundle_stays_close_to_fp32_either_way(hf_model, bundle, tmp_path, monkeypatch):
    """The rewrite changes no number where the GEMM does not saturate, and fixes it where it
    does: forced on, an int8 bundle's logits are as close to fp32's as the int8 codes allow
    (on a Zen 3: 2.6% with it, 21.6% without)."""
    export(hf_model("llama"), tmp_path / "int8", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = [1, 5, 9, 33, 70, 4, 18, 99, 100, 3]
    reference = logits_at(bundle("llama"), ids)
    monkeypatch.setenv("EDGEPREFILL_INT8_ROWS", "off")  # the bundle's DynamicQuantizeMatMul
    monkeypatch.setenv(int8_unsigned.MODE_ENV, "on")
    got = logits_at(tmp_path / "int8", ids)
    assert np.abs(got - reference).max() / np.abs(reference).max() < 0.05


def test_without_proc_cpuinfo_the_flags_are_numpys(monkeypatch):
    """Windows and macOS have no /proc/cpuinfo: numpy's detected features decide there."""
    from numpy._core import _multiarray_umath

    monkeypatch.delenv(int8_unsigned.MODE_ENV, raising=False)
    monkeypatch.setattr(int8_unsigned, "cpu_identity", lambda: "Intel64 Family 6 Model 158")
    monkeypatch.setattr(int8_unsigned.platform, "machine", lambda: "AMD64")
    features = dict(_multiarray_umath.__cpu_features__, AVX2=True, AVX512VNNI=False)
    monkeypatch.setattr(_multiarray_umath, "__cpu_features__", features)
    assert int8_unsigned.cpu_flags() == {"avx2"} and int8_unsigned.saturates()
    monkeypatch.setattr(_multiarray_umath, "__cpu_features__", dict(features, AVX512VNNI=True))
    assert not int8_unsigned.saturates()


def test_the_count_of_int8_projections_names_the_lm_head():
    """`--stats` names the LM head among the int8 projections (an int4 bundle exported with
    `--lm-head int8` has it alone): the projection the graph's logits come from, through
    the ops after it."""
    def graph(outputs: list[str]):
        nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s"], [name],
                                  domain="com.microsoft") for name in outputs]
        nodes.append(helper.make_node("Tanh", [outputs[-1]], ["capped"]))
        if "head" in outputs:
            nodes.append(helper.make_node("Identity", ["capped"], [LOGITS]))
        return helper.make_model(helper.make_graph(nodes, "g", [], []))

    def said(outputs: list[str]) -> str:
        g = graph(outputs)
        return int8_unsigned.counted(g, [n for n in g.graph.node
                                         if n.op_type == "DynamicQuantizeMatMul"])

    assert said(["head"]) == "the LM head's int8 projection"
    assert said(["q", "k", "head"]) == "3 int8 projections (the LM head among them)"
    assert said(["q"]) == "1 int8 projection"
    assert said(["q", "k"]) == "2 int8 projections"
