"""The engine cache: which engine file a device may load, and which it must never load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgeprefill.contract import FileRecord
from edgeprefill.engines.trt.cache import (
    DeviceInfo,
    engine_key,
    engine_paths,
    find_engine,
    prune_stale,
    save_engine,
    usable_records,
)
from edgeprefill.engines.trt.plan import profile_plan
from edgeprefill.engines.trt.runtime import choose_engine
from edgeprefill.errors import BackendError
from tests.trt_fakes import fake_manifest

ORIN = DeviceInfo("Orin", "8.7", "10.15.1.29")


def key_for(manifest=None, device=ORIN, precision="fp16", capacity=256, max_batch=4):
    manifest = manifest or fake_manifest()
    return engine_key(manifest, device, precision, profile_plan(manifest, capacity, max_batch))


def with_files(graph: str = "g", weights: str = "w"):
    m = fake_manifest()
    files = {"model.onnx": FileRecord(graph * 64, 1),
             "model.onnx.data": FileRecord(weights * 64, 1)}
    return dataclasses.replace(m, files=files)


def test_the_key_is_stable_and_names_device_version_and_precision():
    key = key_for()
    assert key == key_for() and key.digest == key_for().digest
    assert key.stem.startswith("orin-sm87-trt10.15.1.29-fp16-")
    assert key.graph_sha256 == "g" * 64 and key.buckets == (16, 64)


@pytest.mark.parametrize("changed", [
    {"manifest": with_files(graph="h")},
    {"manifest": with_files(weights="v")},
    {"device": DeviceInfo("NVIDIA GeForce RTX 4090", "8.9", "10.15.1.29")},
    {"device": DeviceInfo("Orin", "8.7", "10.16.0.1")},
    {"device": DeviceInfo("Orin", "7.2", "10.15.1.29")},
    {"precision": "fp32"},
    {"capacity": 128},
    {"max_batch": 8},
])
def test_any_change_of_graph_gpu_version_precision_or_plan_changes_the_key(changed):
    other = key_for(**changed)
    assert other.digest != key_for().digest and other.stem != key_for().stem


def test_a_saved_engine_is_found_for_its_own_key_only(tmp_path):
    key = key_for()
    path = save_engine(tmp_path, key, b"engine-bytes", {"built_at": 1.0})
    assert find_engine(tmp_path, key) == path and path.read_bytes() == b"engine-bytes"
    assert find_engine(tmp_path, key_for(precision="fp32")) is None
    assert find_engine(tmp_path, key_for(device=DeviceInfo("Thor", "11.0", "10.15.1.29"))) is None
    assert not list(tmp_path.glob("*.tmp")), "writes are atomic"


def test_a_foreign_engine_under_our_name_is_not_loaded(tmp_path):
    """Someone copied another GPU's engine (and record) over ours: the record says so."""
    ours = key_for()
    theirs = key_for(device=DeviceInfo("NVIDIA A100", "8.0", "10.15.1.29"))
    save_engine(tmp_path, theirs, b"a100", {})
    for src, dst in zip(engine_paths(tmp_path, theirs), engine_paths(tmp_path, ours),
                        strict=True):
        dst.write_bytes(src.read_bytes())
    assert find_engine(tmp_path, ours) is None


def test_a_stale_or_tampered_engine_is_not_loaded(tmp_path):
    key = key_for()
    engine, record = engine_paths(tmp_path, key)
    save_engine(tmp_path, key, b"engine-bytes", {})
    engine.write_bytes(b"truncated")
    assert find_engine(tmp_path, key) is None
    engine.write_bytes(b"ENGINE-BYTES")  # same size, other bytes: only the sha256 tells
    assert find_engine(tmp_path, key, verify=False) == engine
    assert find_engine(tmp_path, key) is None
    save_engine(tmp_path, key, b"engine-bytes", {})
    meta = json.loads(record.read_text())
    meta["key"]["graph_sha256"] = "0" * 64  # built from an older graph
    record.write_text(json.dumps(meta))
    assert find_engine(tmp_path, key) is None
    record.write_text("{not json")
    assert find_engine(tmp_path, key) is None


def test_the_runtime_picks_the_newest_engine_of_this_device_and_graph(tmp_path):
    manifest = fake_manifest()
    old, new = key_for(capacity=128), key_for(capacity=256)
    save_engine(tmp_path, old, b"old", {"built_at": 1.0})
    save_engine(tmp_path, new, b"new", {"built_at": 2.0})
    save_engine(tmp_path, key_for(device=DeviceInfo("Thor", "11.0", "10.15.1.29")), b"x", {})
    save_engine(tmp_path, key_for(manifest=with_files(graph="h")), b"stale", {"built_at": 3.0})
    assert usable_records(tmp_path, manifest, ORIN) == [new, old]
    assert usable_records(tmp_path, manifest, DeviceInfo("Orin", "8.7", "10.16.0.1")) == []


def test_pruning_removes_engines_of_older_graphs_and_keeps_other_devices(tmp_path):
    manifest = fake_manifest()
    current = save_engine(tmp_path, key_for(), b"current", {})
    foreign = save_engine(tmp_path, key_for(device=DeviceInfo("Thor", "11.0", "10.15")), b"f", {})
    stale = save_engine(tmp_path, key_for(manifest=with_files(weights="v")), b"stale", {})
    removed = prune_stale(tmp_path, manifest)
    assert sorted(p.name for p in removed) == sorted([stale.name, stale.with_suffix(".json").name])
    assert current.exists() and foreign.exists() and not stale.exists()


def test_the_runtime_loads_the_chosen_engine_with_the_plan_it_was_built_for(tmp_path):
    manifest = fake_manifest()
    with pytest.raises(BackendError, match="edgeprefill build BUNDLE"):
        choose_engine(tmp_path, manifest, ORIN, Path("BUNDLE"))
    path = save_engine(tmp_path, key_for(capacity=128, max_batch=2), b"engine", {})
    engine, plan = choose_engine(tmp_path, manifest, ORIN, Path("BUNDLE"))
    assert engine == path and (plan.capacity, plan.max_batch) == (128, 2)
    with pytest.raises(BackendError, match="no TensorRT engine"):
        choose_engine(tmp_path, manifest, DeviceInfo("Orin", "8.7", "10.16.0.1"), Path("B"))
    path.write_bytes(b"ENGINE")  # same size, corrupt
    with pytest.raises(BackendError, match="corrupt"):
        choose_engine(tmp_path, manifest, ORIN, Path("BUNDLE"))
