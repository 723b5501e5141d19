"""Inconsistent configs are refused at export, edited manifests at load: one line each
(an EdgeprefillError the CLI prints), never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.contract import FileRecord
from edgeprefill.errors import BundleError, ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from tests.test_cli_errors import assert_one_line_error, cli

OPTIONS = ExportOptions(chunks=(16,), max_context=64, show_progress=False)


def edited_model(hf_model, tmp_path, **changes):
    src = hf_model("llama")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes, message", [
    ({"num_attention_heads": 0}, "num_attention_heads must be positive"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be positive"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be positive"),
    ({"hidden_size": -64}, "hidden_size must be positive"),
    ({"vocab_size": 100}, "tokenizer produces ids up to 127"),
    ({"eos_token_id": 500}, "outside the vocabulary"),
    ({"rms_norm_eps": 0}, "rms_norm_eps must be positive"),
    ({"head_dim": 15}, "head_dim must be even"),
    ({"vocab_size": None}, "config.json: vocab_size is null; it must be a positive integer"),
    ({"intermediate_size": None}, "config.json: intermediate_size is null"),
])
def test_an_inconsistent_config_is_refused_in_one_line(hf_model, tmp_path, changes, message):
    model = edited_model(hf_model, tmp_path, **changes)
    with pytest.raises(ExportError, match=message):
        export(model, tmp_path / "out", OPTIONS)
    assert not (tmp_path / "out").exists()


def test_model_config_refuses_zero_heads_without_dividing_by_them():
    raw = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 0, "vocab_size": 128}
    with pytest.raises(ExportError, match="num_attention_heads must be positive"):
        ModelConfig.from_hf(raw)


@pytest.fixture(scope="module")
def manifest_text(bundle) -> str:
    return (bundle("llama") / MANIFEST_FILE).read_text()


def edit(manifest: dict, path: str, value) -> dict:
    *parents, leaf = path.split(".")
    node = manifest
    for key in parents:
        node = node[key]
    node[leaf] = value
    return manifest


@pytest.mark.parametrize("path, value, message", [
    ("files", ["model.onnx"], "'files' must be"),
    ("files", {"model.onnx": 5}, "'files' must be"),
    ("chunks", [], "chunks must be distinct positive sizes"),
    ("chunks", [64, 16], "ascending"),
    ("chunks", "16", "'chunks' must be"),
    ("max_context", 10**12, "max_context must be in"),
    ("max_context", 512.5, "'max_context' must be int"),
    ("max_context", "512", "'max_context' must be int"),
    ("max_context", True, "'max_context' must be int"),
    ("eos_token_ids", [9999], "outside the vocabulary"),
    ("bos_token_id", "w1", "'bos_token_id' must be"),
    ("model", [1, 2], "'model' must be an object"),
    ("model.num_kv_heads", 0, "num_kv_heads must be positive"),
    ("model.num_heads", 3, "not a multiple"),
    ("model.vocab_size", None, "'vocab_size' must be int"),
    ("graph.kv_inputs", [["a", "b"]], "one \\[key, value\\] pair per layer"),
    ("model.state_layers", [1, 0], "model.state_layers \\[1, 0\\] .* ascending order"),
    # the llama bundle's 2 layers all carrying states: a bundle without KV (Mamba-2's), whose
    # graph lacks the state tensors
    ("model.state_layers", [0, 1], "exactly where model.state_layers is"),
    ("model.state_layers", [1], "exactly where model.state_layers is"),  # no state tensors
    ("graph.state_inputs", ["past_conv.1"], "must pair up"),
    ("graph.opsets", {"": "17"}, "'opsets' must be"),
    ("tokenizer.chat_template", 5, "'chat_template' must be"),
])
def test_an_edited_manifest_is_a_one_line_bundle_error(bundle, tmp_path, manifest_text,
                                                       path, value, message):
    from edgeprefill.sdk import Engine

    edited = tmp_path / "edited"
    shutil.copytree(bundle("llama"), edited)
    (edited / MANIFEST_FILE).write_text(json.dumps(edit(json.loads(manifest_text), path, value)))
    with pytest.raises(BundleError, match=message):
        load_manifest(edited)
    with pytest.raises(BundleError, match=message):
        Engine.load(edited, threads=1)


def test_the_cli_says_so_in_one_line(hf_model, bundle, tmp_path, manifest_text):
    model = edited_model(hf_model, tmp_path, num_key_value_heads=0)
    assert_one_line_error(cli("export", model, "-o", tmp_path / "out"),
                          "num_key_value_heads must be positive")
    edited = tmp_path / "edited"
    shutil.copytree(bundle("llama"), edited)
    (edited / MANIFEST_FILE).write_text(json.dumps(edit(json.loads(manifest_text), "files", [])))
    assert_one_line_error(cli("inspect", edited), "'files' must be")


def test_the_exported_manifest_passes_its_own_checks(bundle):
    load_manifest(bundle("llama"), verify_checksums=True)


@pytest.mark.parametrize("record", [{"bytes": 1}, {"sha256": "ab", "bytes": True},
                                    {"sha256": 7, "bytes": 1}])
def test_a_malformed_file_record_is_a_one_line_bundle_error(bundle, tmp_path, manifest_text,
                                                           record):
    edited = tmp_path / "edited"
    shutil.copytree(bundle("llama"), edited)
    raw = json.loads(manifest_text)
    raw["files"]["model.onnx"] = record
    (edited / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"files\['model.onnx'\] must be \{'sha256': str"):
        load_manifest(edited)


def test_file_records_are_typed_in_memory_and_objects_on_disk(bundle, manifest_text):
    manifest = load_manifest(bundle("llama"))
    on_disk = json.loads(manifest_text)["files"]
    assert manifest.files == {name: FileRecord(r["sha256"], r["bytes"])
                              for name, r in on_disk.items()}
    assert manifest.to_json() == manifest_text  # the JSON format is unchanged
