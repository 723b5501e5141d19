"""The chunk-graph contract: one definition of the step tensors, checked at load."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import edgeprefill
from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.contract import (
    FileRecord,
    KVPair,
    check_graph_io,
    file_records,
    kv_names,
    kv_pairs,
    step_io,
)
from edgeprefill.errors import BundleError
from tests.fake_backend import fake_manifest

PACKAGE = Path(edgeprefill.__file__).parent


def contract_manifest(layers: int = 2):
    m = fake_manifest()
    model = replace(m.model, num_layers=layers)
    io = step_io(layers, model.num_kv_heads, model.head_dim, model.vocab_size, "float32")
    names = [kv_names(i) for i in range(layers)]
    graph = replace(m.graph, inputs=io.inputs, outputs=io.outputs,
                    kv_inputs=[[n.past_key, n.past_value] for n in names],
                    kv_outputs=[[n.present_key, n.present_value] for n in names])
    return replace(m, model=model, graph=graph)


def write(tmp_path: Path, manifest) -> Path:
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(asdict(manifest)))
    return tmp_path


def test_a_manifest_that_follows_the_contract_loads(tmp_path):
    loaded = load_manifest(write(tmp_path, contract_manifest()))
    assert kv_pairs(loaded.graph) == [
        KVPair("past_key.0", "present_key.0"), KVPair("past_value.0", "present_value.0"),
        KVPair("past_key.1", "present_key.1"), KVPair("past_value.1", "present_value.1")]


@pytest.mark.parametrize("change, message", [
    (lambda io: io.inputs.pop("past_lens"), "missing past_lens"),
    (lambda io: io.inputs.__setitem__("positions", ["int64", ["batch", "chunk"]]),
     "unexpected positions"),
    (lambda io: io.outputs.__setitem__("logits", ["float32", ["batch", "chunk", 128]]),
     "logits is"),
    (lambda io: io.inputs.__setitem__("past_key.1", ["float16", ["batch", 1, "capacity", 8]]),
     "past_key.1 is"),
])
def test_a_graph_that_differs_from_the_contract_is_refused_in_one_line(tmp_path, change,
                                                                        message):
    manifest = contract_manifest()
    change(manifest.graph)
    with pytest.raises(BundleError, match=message):
        load_manifest(write(tmp_path, manifest))


def test_kv_pairs_out_of_arena_order_are_refused():
    manifest = contract_manifest()
    manifest.graph.kv_outputs.reverse()
    with pytest.raises(BundleError, match="KV input/output pairs"):
        check_graph_io(manifest)


def test_file_records_are_typed():
    records = file_records({"model.onnx": {"sha256": "ab", "bytes": 3}})
    assert records == {"model.onnx": FileRecord("ab", 3)}


@pytest.mark.parametrize("name", ["input_ids", "past_lens", "valid_lens", "logits", "hidden",
                                  "past_key", "present_value",
                                  "past_", "present_"])  # past_{kind}.{i} of a state
def test_each_step_tensor_name_is_spelled_in_one_module(name):
    spelled = re.compile(r"[\"']" + re.escape(name) + r"[\"'.{]")
    files = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
             if spelled.search(p.read_text())]
    assert files == ["contract.py"]


def test_a_graph_file_that_differs_from_its_manifest_is_refused_at_load(bundle, tmp_path):
    import onnx

    from edgeprefill.bundle import file_record
    from edgeprefill.sdk import Engine

    copy = tmp_path / "bundle"
    shutil.copytree(bundle("llama"), copy)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    graph_path = copy / manifest["graph"]["file"]
    model = onnx.load(str(graph_path), load_external_data=False)
    model.graph.input.append(onnx.helper.make_tensor_value_info(
        "positions", onnx.TensorProto.INT64, ["batch", "chunk"]))  # an older contract's input
    onnx.save(model, str(graph_path))
    manifest["files"][manifest["graph"]["file"]] = file_record(graph_path)._asdict()
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="model.onnx does not match its manifest: the "
                                          "inputs positions differ"):
        Engine.load(copy, background=False)
