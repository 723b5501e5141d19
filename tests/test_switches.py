"""One If per step (engines/ort/switches.py): an int4 bundle with the native kernels has its
150-odd switch Ifs merged into one, and computes exactly what the unmerged graph computes,
prefill chunks and decode steps, with the KV cache still written in place; bundles whose
unswitched nodes hold weights keep their Ifs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import backend as backend_module
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.int4_prefill import IS_DECODE
from edgeprefill.engines.ort.switches import Switches, merge_switches
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from tests.conftest import TINY_MODEL

CONTEXT = 96


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "b"
    export(TINY_MODEL, out, ExportOptions(
        chunks=(16, 64), max_context=CONTEXT, show_progress=False, quant=QuantConfig("int4")))
    return out



def load(bundle, monkeypatch, merge: bool) -> OnnxRuntimeBackend:
    monkeypatch.setattr(backend_module, "merge_switches",
                        merge_switches if merge else (lambda graph: Switches(0)))
    loaded = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=2))
    loaded.allocate_kv(2, CONTEXT)
    return loaded


def steps(b: OnnxRuntimeBackend) -> list[np.ndarray]:
    """Two rows: a 40-token prompt in chunks of 16 into slot 0, a 7-token one into slot 1,
    then 6 decode steps of both rows together; every step's logits."""
    rng = np.random.default_rng(0)
    out = []
    for slot, length in ((0, 40), (1, 7)):
        ids = rng.integers(3, 100, length)
        for at in range(0, length, 16):
            piece = ids[at : at + 16]
            padded = np.zeros((1, 16), np.int64)
            padded[0, : len(piece)] = piece
            out.append(b.run(StepBatch(padded, np.array([at], np.int32),
                                       np.array([len(piece)], np.int32), slot)).copy())
    lens = np.array([40, 7], np.int32)
    token = np.array([[5], [6]])
    for _ in range(6):
        logits = b.run(StepBatch(token, lens, np.ones(2, np.int32), 0)).copy()
        out.append(logits)
        token, lens = logits.argmax(-1)[:, None], lens + 1
    return out


def test_merged_graph_computes_the_same_bits(int4_bundle, library, monkeypatch):
    plain = load(int4_bundle, monkeypatch, merge=False)
    merged = load(int4_bundle, monkeypatch, merge=True)
    assert plain.switches.merged == 0
    assert merged.switches.merged >= 2 * load_manifest(int4_bundle).model.num_layers
    want, got = steps(plain), steps(merged)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)
    # The cache lives in the arena the engine bound: written there, in place, by both.
    for a, b in zip(plain.kv_arrays(), merged.kv_arrays(), strict=True):
        assert np.abs(b).sum() > 0
        np.testing.assert_array_equal(b, a)


def test_a_hybrid_int4_bundle_loads_merged_and_computes_the_same_bits(
        hf_model, tmp_path, library, monkeypatch):
    """Qwen3.5's first DeltaNet layer makes int64 token indices that later layers read: a
    value the merged If hands on that is not float (declared float, the load failed)."""
    export(hf_model("qwen3_5_text"), tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=CONTEXT, show_progress=False, quant=QuantConfig("int4")))
    plain = load(tmp_path / "b", monkeypatch, merge=False)
    merged = load(tmp_path / "b", monkeypatch, merge=True)
    assert merged.switches.merged >= 2 * load_manifest(tmp_path / "b").model.num_layers
    for a, b in zip(steps(plain), steps(merged), strict=True):
        np.testing.assert_array_equal(b, a)


def test_an_int4_model_whose_last_layer_convolves_merges_and_computes_the_same_bits(
        hf_model, tmp_path, library, monkeypatch):
    """LFM3's fixture (LFM2's and LFM3's released layouts too) ends with a conv layer,
    whose state indices (int64, from valid_lens) are made between the switches and read
    after the last one: they run before the If, which would otherwise declare them float
    and fail to load."""
    out = tmp_path / "b"
    export(hf_model("lfm3"), out, ExportOptions(
        chunks=(16, 64), max_context=CONTEXT, show_progress=False, quant=QuantConfig("int4")))
    plain, merged = load(out, monkeypatch, merge=False), load(out, monkeypatch, merge=True)
    assert merged.switches.merged >= 2
    for a, b in zip(steps(plain), steps(merged), strict=True):
        np.testing.assert_array_equal(b, a)


def test_nodes_that_read_no_switch_run_before_the_if():
    made = helper.make_node("Cast", ["lens"], ["lens64"], to=TensorProto.INT64)
    read = helper.make_node("Add", ["lens64", "lens64"], ["late"])
    nodes = [*switch("a"), made, helper.make_node("Identity", ["a.out"], ["b.in"]),
             *switch("b"), read]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("lens", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (
            ("b.out", TensorProto.FLOAT), ("late", TensorProto.INT64))])
    model = helper.make_model(graph)
    assert merge_switches(model) == Switches(2)
    assert [n.op_type for n in model.graph.node] == ["Cast", "If", "Add"]
    assert list(model.graph.node[1].output) == ["b.out"]


def test_stats_say_the_switches_were_merged(int4_bundle, library, monkeypatch):
    from edgeprefill.cli.report import backend_line

    merged = load(int4_bundle, monkeypatch, merge=True)
    assert f"one If per step ({merged.switches.merged} switches merged)" in backend_line(merged)


def switch(name: str, weight: str | None = None) -> list[onnx.NodeProto]:
    """A switch If (Neg on decode, Abs on prefill) after an optional MatMul on `weight`."""
    nodes, source = [], f"{name}.in"
    if weight:
        nodes.append(helper.make_node("MatMul", [source, weight], [f"{name}.mm"]))
        source = f"{name}.mm"
    branches = [helper.make_graph([helper.make_node(op, [source], [f"{name}.{op}"])],
                                  f"{name}.{op}", [],
                                  [helper.make_tensor_value_info(f"{name}.{op}",
                                                                 TensorProto.FLOAT, None)])
                for op in ("Neg", "Abs")]
    nodes.append(helper.make_node("If", [IS_DECODE], [f"{name}.out"],
                                  then_branch=branches[0], else_branch=branches[1]))
    return nodes


def test_a_weight_between_the_switches_keeps_them_apart():
    big = helper.make_tensor("w", TensorProto.FLOAT, [128, 128], np.zeros(128 * 128))
    nodes = [*switch("a"), helper.make_node("Identity", ["a.out"], ["b.in"]),
             *switch("b", weight="w")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "b.out", TensorProto.FLOAT, None)], [big])
    model = helper.make_model(graph)
    before = model.SerializeToString()
    result = merge_switches(model)
    assert result.merged == 0 and "twice" in result.why_not
    assert model.SerializeToString() == before


def test_small_nodes_between_switches_go_into_both_branches():
    nodes = [*switch("a"), helper.make_node("Identity", ["a.out"], ["b.in"]), *switch("b")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "b.out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph)
    assert merge_switches(model) == Switches(2)
    (only,) = model.graph.node
    assert only.op_type == "If" and list(only.output) == ["b.out"]
    then = next(a.g for a in only.attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Neg", "Identity", "Neg"]
    assert [o.name for o in then.output] == ["b.out.decode"]
