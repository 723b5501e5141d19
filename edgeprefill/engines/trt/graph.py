"""The `standard` chunk graph as TensorRT's ONNX parser receives it.

The bundle's graph keeps the KV capacity symbolic so that ONNX Runtime can run any
capacity. TensorRT imports `TensorScatter` as its KV-cache update layer (IKVCacheUpdateLayer)
only when the cache is a 4D network input with a static sequence axis and the scatter axis
is -2 (the exporter writes it so), so before parsing we pin the capacity axis of every
KV input and output to the engine's capacity.

The weights stay in the bundle's external data file: the parser is given the bundle's graph
path, so the rewritten graph resolves `model.onnx.data` next to it.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from edgeprefill.bundle import Manifest, load_graph
from edgeprefill.engines.trt.ops import MAX_OPSET, restriction_problems, unsupported_ops
from edgeprefill.errors import BackendError

PREP_VERSION = 1  # bump when prepare_graph changes what the parser sees: part of the engine key
CAPACITY_AXIS = 2  # [B, kv_heads, capacity, head_dim]


def require_standard(manifest: Manifest) -> None:
    if manifest.graph.flavor != "standard":
        raise BackendError(
            f"this bundle holds the {manifest.graph.flavor!r} graph flavour, which TensorRT "
            "cannot parse (it uses ONNX Runtime contrib ops); re-export it with "
            "`edgeprefill export ... --flavor standard`"
        )


def refuse_state(manifest: Manifest) -> None:
    """The engine binds KV arenas of one shape in place and nothing else: a bundle whose
    layers carry a recurrent state (LFM2, Qwen3.5) or KV of their own shapes (Gemma 4)
    runs on the onnxruntime backend only."""
    if manifest.model.state_layers:
        raise BackendError(
            f"the tensorrt backend cannot run {manifest.model.family} bundles: their "
            "layers carry a recurrent state it does not bind; use --backend onnxruntime")
    if manifest.model.layer_kv:  # its plan sizes every arena alike (plan.position_bytes)
        raise BackendError(
            f"the tensorrt backend cannot run {manifest.model.family} bundles: their layers' "
            "KV caches differ in shape (heads or head size); use --backend onnxruntime")


def kv_tensor_names(manifest: Manifest) -> set[str]:
    graph = manifest.graph
    return {n for pair in graph.kv_inputs + graph.kv_outputs for n in pair}


def prepare_graph(model: onnx.ModelProto, kv_names: set[str], capacity: int) -> onnx.ModelProto:
    """A copy of the graph with the KV capacity pinned."""
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    graph = prepared.graph
    for value in list(graph.input) + list(graph.output):
        if value.name in kv_names:
            dim = value.type.tensor_type.shape.dim[CAPACITY_AXIS]
            dim.Clear()
            dim.dim_value = capacity
    return prepared


def graph_problems(model: onnx.ModelProto, kv_names: set[str]) -> list[str]:
    """Why TensorRT's parser would reject the prepared graph, or not build it in place."""
    problems = [f"operator {op} is not supported by TensorRT's ONNX parser"
                for op in unsupported_ops(n.op_type for n in model.graph.node)]
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset > MAX_OPSET:
        problems.append(f"opset {opset} is newer than TensorRT's parser reads ({MAX_OPSET})")
    problems += restriction_problems(model)
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name in kv_names:
            dims = value.type.tensor_type.shape.dim
            if any(not d.HasField("dim_value") for d in dims[1:]):
                problems.append(f"{value.name}: every axis but the batch must be static")
    return problems


def parser_ready_graph(bundle_dir: Path, manifest: Manifest, capacity: int) -> onnx.ModelProto:
    """The graph to give TensorRT's parser (weights stay external), checked."""
    require_standard(manifest)
    names = kv_tensor_names(manifest)
    model = prepare_graph(load_graph(bundle_dir, manifest), names, capacity)
    problems = graph_problems(model, names)
    if problems:
        shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if problems[5:] else "")
        raise BackendError(f"the graph cannot be built with TensorRT: {shown}")
    return model
