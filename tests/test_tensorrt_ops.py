"""The standard chunk graph is one TensorRT's ONNX parser can import, in place."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines.trt.graph import (
    graph_problems,
    kv_tensor_names,
    parser_ready_graph,
    prepare_graph,
)
from edgeprefill.engines.trt.ops import (
    MIN_TENSORRT,
    SOURCE,
    SUPPORTED_OPS,
    restriction_problems,
    unsupported_ops,
)
from edgeprefill.errors import BackendError
from edgeprefill.export.exporter import ExportOptions, export
from tests.conftest import FAMILIES, build_hf_model


@pytest.fixture(scope="module")
def fp16_standard(tmp_path_factory):
    import torch

    hf = build_hf_model("llama", tmp_path_factory.mktemp("hf-fp16"), dtype=torch.float16)
    out = tmp_path_factory.mktemp("bundle-fp16-standard")
    export(hf, out, ExportOptions(flavor="standard", dtype="fp16", chunks=(16, 64),
                                  max_context=256, show_progress=False, overwrite=True))
    return out


def test_the_table_names_its_source_and_version():
    assert "10.15" in SOURCE and MIN_TENSORRT == (10, 15)
    assert "axis must be -2" in SUPPORTED_OPS["TensorScatter"]
    assert "GroupQueryAttention" not in SUPPORTED_OPS  # an ONNX Runtime contrib op


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_operator_of_the_standard_graph_is_in_the_parser_table(bundle, family):
    bundle_dir = bundle(family, "standard")
    manifest = load_manifest(bundle_dir)
    model = load_graph(bundle_dir, manifest)
    assert unsupported_ops(n.op_type for n in model.graph.node) == []
    # the KV writes; a model whose no layer attends (Mamba) has none to write
    assert ("TensorScatter" in {n.op_type for n in model.graph.node}) == bool(
        manifest.model.kv_layers)


def test_the_fp16_standard_graph_is_in_the_parser_table_too(fp16_standard):
    manifest = load_manifest(fp16_standard)
    prepared = parser_ready_graph(fp16_standard, manifest, 256)
    assert graph_problems(prepared, kv_tensor_names(manifest)) == []


@pytest.mark.parametrize("family", ("qwen3_moe", "qwen2_moe"))
def test_a_mixture_of_experts_standard_graph_breaks_no_parser_restriction(bundle, family):
    """The unrolled experts combine through a ScatterND without a reduction (TensorRT's
    parser refuses one with), and their TopK is sorted."""
    bundle_dir = bundle(family, "standard")
    manifest = load_manifest(bundle_dir)
    prepared = parser_ready_graph(bundle_dir, manifest, 256)
    assert graph_problems(prepared, kv_tensor_names(manifest)) == []
    assert {"NonZero", "ScatterND", "TopK"} <= {n.op_type for n in prepared.graph.node}


def test_the_ort_flavour_uses_operators_tensorrt_cannot_parse(bundle):
    bundle_dir = bundle("llama", "ort")
    model = load_graph(bundle_dir, load_manifest(bundle_dir))
    assert "GroupQueryAttention" in unsupported_ops(n.op_type for n in model.graph.node)
    with pytest.raises(BackendError, match="--flavor standard"):
        parser_ready_graph(bundle_dir, load_manifest(bundle_dir), 64)


def test_prepared_graph_has_static_kv_axes_and_scatter_axis_minus_two(bundle):
    bundle_dir = bundle("qwen3", "standard")
    manifest = load_manifest(bundle_dir)
    names = kv_tensor_names(manifest)
    raw = load_graph(bundle_dir, manifest)
    # As exported the capacity is symbolic: TensorRT could not update the cache in place.
    assert any("every axis but the batch must be static" in p for p in graph_problems(raw, names))
    prepared = parser_ready_graph(bundle_dir, manifest, 128)
    assert graph_problems(prepared, names) == []
    m = manifest.model
    for value in list(prepared.graph.input) + list(prepared.graph.output):
        if value.name in names:
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param == "batch"  # each profile sets the batch
            assert [d.dim_value for d in dims[1:]] == [m.num_kv_heads, 128, m.head_dim]
    scatters = [n for n in prepared.graph.node if n.op_type == "TensorScatter"]
    assert len(scatters) == 2 * m.num_layers
    assert all(a.i == -2 for n in scatters for a in n.attribute if a.name == "axis")


def test_prepared_graph_computes_what_the_bundle_graph_computes(bundle):
    bundle_dir = bundle("llama", "standard")
    manifest = load_manifest(bundle_dir)
    capacity = 64
    raw = load_graph(bundle_dir, manifest)
    prepared = prepare_graph(raw, kv_tensor_names(manifest), capacity)
    m = manifest.model
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(3, 100, size=(1, 16)).astype(np.int64),
        "past_lens": np.array([5], np.int32),
        "valid_lens": np.array([11], np.int32),
    }
    for name in (n for pair in manifest.graph.kv_inputs for n in pair):
        cache = rng.standard_normal((1, m.num_kv_heads, capacity, m.head_dim))
        feeds[name] = cache.astype(np.float32)
    outputs = []
    for model in (raw, prepared):
        onnx.load_external_data_for_model(model, str(bundle_dir))
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, feeds))
    for got, want in zip(*outputs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_restriction_checks_catch_what_the_parser_would_refuse():
    past = helper.make_tensor_value_info("past", onnx.TensorProto.FLOAT, [1, 2, "cap", 4])
    update = helper.make_tensor_value_info("upd", onnx.TensorProto.FLOAT, [1, 2, 3, 4])
    axes = helper.make_tensor_value_info("axes", onnx.TensorProto.INT64, [1])
    out = helper.make_tensor_value_info("present", onnx.TensorProto.FLOAT, [1, 2, "cap", 4])
    nodes = [
        helper.make_node("TensorScatter", ["past", "upd"], ["scattered"], name="ts", axis=2),
        helper.make_node("Identity", ["scattered"], ["present"], name="id"),
        helper.make_node("ReduceMean", ["upd", "axes"], ["mean"], name="rm"),
        helper.make_node("GroupQueryAttention", ["upd"], ["gqa"], name="gqa",
                         domain="com.microsoft"),
        helper.make_node("ScatterND", ["upd", "axes", "upd"], ["sum"], name="sn",
                         reduction="add"),
    ]
    graph = helper.make_graph(nodes, "g", [past, update, axes], [out])
    problems = "\n".join(restriction_problems(helper.make_model(graph)))
    assert "TensorScatter axis is 2" in problems
    assert "updated cache must be a graph output" in problems
    assert "ReduceMean input 1 must be a constant" in problems
    assert "custom-domain op com.microsoft.GroupQueryAttention" in problems
    assert "ScatterND reduction 'add', TensorRT needs 'none'" in problems
