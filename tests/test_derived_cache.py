"""The disk cache of load-time derived weights (edgeprefill/engines/ort/derived_cache.py): a
second load maps what the first derived, without deriving, and computes the same logits; a
re-export or a damaged file means deriving again; a cache that cannot be written never
fails a load; `off` writes nothing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import bf16_compute, int4_decode, int4_prefill
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.derived_cache import CACHE_ENV
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from tests.conftest import TINY_INT4_CONTEXT, TINY_MODEL

CONTEXT = TINY_INT4_CONTEXT
PROMPT = [5, 17, 42, 7, 99, 3, 12, 64]


def load(bundle: Path, cache: Path | str, monkeypatch, kernels: str = "off",
         compute: str = "fp32") -> OnnxRuntimeBackend:
    monkeypatch.setenv(CACHE_ENV, str(cache))
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    b = OnnxRuntimeBackend(bundle, load_manifest(bundle),
                           BackendOptions(threads=2, compute=compute))
    b.allocate_kv(1, CONTEXT)
    return b


def logits(backend: OnnxRuntimeBackend) -> np.ndarray:
    step = StepBatch(np.array([PROMPT]), np.array([0], np.int32),
                     np.array([len(PROMPT)], np.int32), 0)
    return backend.run(step).copy()


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []


def refuse(*_args, **_kwargs):
    raise AssertionError("derived again although the cache holds it")


def test_second_load_maps_the_cached_int8_weights(tiny_int4_bundle, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = load(tiny_int4_bundle, cache, monkeypatch)
    want = logits(first)
    (folder,) = entries(cache)
    assert len(list(folder.glob("*.npy"))) == len(first.int4_prefill.weights) > 0
    monkeypatch.setattr(int4_prefill, "int4_dequantize", refuse)
    second = load(tiny_int4_bundle, cache, monkeypatch)
    assert all(isinstance(array, np.memmap) for array, _ in second.int4_prefill.weights)
    np.testing.assert_array_equal(logits(second), want)


@pytest.mark.skipif(not int4_decode.cpu_has_int_kernels(), reason="no AVX512-VNNI nor AVX2 here")
def test_second_load_maps_the_repacked_int4_weights(library, tiny_int4_bundle, tmp_path,
                                                    monkeypatch):
    cache = tmp_path / "cache"
    first = load(tiny_int4_bundle, cache, monkeypatch, kernels="require")
    assert first.int4_decode.rewritten > 0
    want = logits(first)
    monkeypatch.setattr(int4_decode, "repack", refuse)
    monkeypatch.setattr(int4_prefill, "int4_dequantize", refuse)
    second = load(tiny_int4_bundle, cache, monkeypatch, kernels="require")
    assert second.int4_decode.rewritten == first.int4_decode.rewritten
    np.testing.assert_array_equal(logits(second), want)


def test_second_load_maps_the_packed_bf16_weights(library, tiny_bundle, tmp_path,
                                                  monkeypatch):
    if not (bf16_compute.cpu_has_bf16() or bf16_compute.widens_bf16()):
        pytest.skip("bf16 compute would run the slow portable loops here")
    cache = tmp_path / "cache"
    want = logits(load(tiny_bundle, cache, monkeypatch, "require", "bf16"))
    monkeypatch.setattr(bf16_compute, "pack", refuse)
    second = load(tiny_bundle, cache, monkeypatch, "require", "bf16")
    assert second.compute.rewritten > 0
    np.testing.assert_array_equal(logits(second), want)


def test_a_reexport_replaces_the_bundles_entry(tmp_path, monkeypatch):
    bundle = tmp_path / "b"
    options = ExportOptions(chunks=(16,), max_context=CONTEXT, show_progress=False,
                            quant=QuantConfig("int4"), overwrite=True)
    export(TINY_MODEL, bundle, options)
    cache = tmp_path / "cache"
    load(bundle, cache, monkeypatch)
    (old,) = entries(cache)
    export(TINY_MODEL, bundle, options)  # new weight files: new sizes or times
    weights = bundle / "model.onnx.data"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    derived = []
    real = int4_prefill.int4_dequantize
    monkeypatch.setattr(int4_prefill, "int4_dequantize",
                        lambda *a: derived.append(1) or real(*a))
    load(bundle, cache, monkeypatch)
    assert derived, "the re-exported bundle's weights were not derived again"
    (new,) = entries(cache)  # the stale entry is gone
    assert new != old


def test_a_damaged_file_is_derived_again(tiny_int4_bundle, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    want = logits(load(tiny_int4_bundle, cache, monkeypatch))
    (folder,) = entries(cache)
    victim = sorted(folder.glob("*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:40])  # a truncated header
    with caplog.at_level(logging.WARNING):
        again = load(tiny_int4_bundle, cache, monkeypatch)
    assert "cannot read it" in caplog.text
    np.testing.assert_array_equal(logits(again), want)
    np.load(victim)  # rewritten whole by the load that derived it again


def test_an_array_of_another_shape_is_derived_again(tiny_int4_bundle, tmp_path, monkeypatch,
                                                    caplog):
    """np.load reads a valid array of another dtype and shape without complaint: it had
    reached the rewrites (ValueError in int4_decode) instead of being derived again."""
    cache = tmp_path / "cache"
    want = logits(load(tiny_int4_bundle, cache, monkeypatch))
    (folder,) = entries(cache)
    for path in folder.glob("*.npy"):
        np.save(path, np.zeros((3, 5), np.int8))
    with caplog.at_level(logging.WARNING):
        again = load(tiny_int4_bundle, cache, monkeypatch)
    assert "is not the array it recorded" in caplog.text
    np.testing.assert_array_equal(logits(again), want)


def test_an_empty_file_is_derived_again(tiny_int4_bundle, tmp_path, monkeypatch, caplog):
    """np.load raises EOFError on an empty file: every load had died ("aborted")."""
    cache = tmp_path / "cache"
    want = logits(load(tiny_int4_bundle, cache, monkeypatch))
    (folder,) = entries(cache)
    sorted(folder.glob("*.npy"))[0].write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        again = load(tiny_int4_bundle, cache, monkeypatch)
    assert "cannot read it" in caplog.text
    np.testing.assert_array_equal(logits(again), want)


def test_a_cache_folder_the_user_may_not_enter_never_fails_a_load(tiny_int4_bundle, tmp_path,
                                                                    monkeypatch, caplog):
    """Path.is_dir raises PermissionError (it swallows only 'no such file'): a service
    account whose HOME is another user's had a traceback from every command."""
    cache = tmp_path / "cache"
    want = logits(load(tiny_int4_bundle, cache, monkeypatch))
    real = Path.is_dir

    def is_dir(path):
        if cache in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "is_dir", is_dir)
    with caplog.at_level(logging.WARNING):
        again = load(tiny_int4_bundle, cache, monkeypatch)
    assert "cannot read it" in caplog.text
    np.testing.assert_array_equal(logits(again), want)


def test_a_copy_of_another_export_with_the_same_sizes_and_times_is_another_entry(
        tiny_int4_bundle, tmp_path, monkeypatch):
    """The key had been path, size and modification time only: `cp -a` of another export
    of the same shapes onto the same path reused the first one's derived weights (wrong
    output, no error). The manifest's recorded digest is in the key now."""
    import json
    import shutil

    bundle, cache = tmp_path / "b", tmp_path / "cache"
    shutil.copytree(tiny_int4_bundle, bundle)
    load(bundle, cache, monkeypatch)
    manifest = json.loads((bundle / "edgeprefill.json").read_text())
    manifest["files"]["model.onnx.data"]["sha256"] = "0" * 64  # another export's weights
    (bundle / "edgeprefill.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(int4_prefill, "int4_dequantize", refuse)
    with pytest.raises(AssertionError, match="derived again"):
        load(bundle, cache, monkeypatch)


def test_an_unwritable_cache_never_fails_a_load(tiny_int4_bundle, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    want = logits(load(tiny_int4_bundle, tmp_path / "fresh", monkeypatch))
    with caplog.at_level(logging.WARNING):
        b = load(tiny_int4_bundle, blocker / "cache", monkeypatch)
    assert "cannot write it" in caplog.text and CACHE_ENV in caplog.text
    np.testing.assert_array_equal(logits(b), want)


@pytest.mark.parametrize("given", ["relative/cache", "", None])
def test_a_relative_or_empty_xdg_cache_home_is_the_home_folder_s(tmp_path, monkeypatch, given):
    """As the XDG Base Directory spec says: a relative one had put the cache in whatever
    folder each process started in."""
    from edgeprefill.cache_dir import user_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    if given is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", given)
    assert user_cache_dir("derived") == tmp_path / "home" / ".cache" / "edgeprefill" / "derived"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir("kernels") == tmp_path / "xdg" / "edgeprefill" / "kernels"


def test_off_writes_nothing(tiny_int4_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load(tiny_int4_bundle, "off", monkeypatch)
    assert not (tmp_path / "edgeprefill").exists()


def test_inspect_says_where_the_derived_weights_are(tiny_int4_bundle, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    def derived_line() -> str:
        out = CliRunner().invoke(cli, ["inspect", str(tiny_int4_bundle)]).output
        return next(line for line in out.splitlines() if line.startswith("derived"))

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    assert "empty: the first load" in derived_line()
    load(tiny_int4_bundle, cache, monkeypatch)
    (folder,) = entries(cache)
    line = derived_line()
    assert str(folder) in line and f"{len(list(folder.glob('*.npy')))} arrays" in line
    monkeypatch.setenv(CACHE_ENV, "off")
    assert "not cached" in derived_line()


def test_a_failed_write_leaves_no_partial_file(tiny_int4_bundle, tmp_path, monkeypatch, caplog):
    from edgeprefill.engines.ort import derived_cache

    def full_disk(out, array, allow_pickle):
        out.write(b"\\x93NUMPY half of a header")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(derived_cache.np, "save", full_disk)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        want = logits(load(tiny_int4_bundle, cache, monkeypatch))
    assert "No space left on device" in caplog.text
    (folder,) = entries(cache)
    assert sorted(p.name for p in folder.iterdir()) == ["bundle.txt"]
    monkeypatch.undo()
    np.testing.assert_array_equal(logits(load(tiny_int4_bundle, cache, monkeypatch)), want)



@pytest.mark.parametrize("value", ["0", "false", "relative/folder"])
def test_a_value_that_is_neither_off_nor_a_folder_is_refused(tiny_int4_bundle, monkeypatch,
                                                             value):
    from edgeprefill.errors import BackendError

    with pytest.raises(BackendError, match=f"{CACHE_ENV}='{value}'.*absolute folder, or off"):
        load(tiny_int4_bundle, value, monkeypatch)


def test_names_derived_once_per_load_are_not_derived_again(tiny_int4_bundle, tmp_path,
                                                           monkeypatch):
    """A weight two nodes share is derived (or read from the cache) once per load:
    `Derived.cached` hands back what this load already holds under those names."""
    from edgeprefill.bundle import load_graph
    from edgeprefill.engines.ort.derived import Derived

    monkeypatch.setenv(CACHE_ENV, "off")
    graph = load_graph(tiny_int4_bundle, load_manifest(tiny_int4_bundle))
    derived = Derived(graph, tiny_int4_bundle)
    made = derived.cached(["w", "s"], lambda: [np.ones(3, np.float32), np.zeros(2, np.int32)])
    again = derived.cached(["w", "s"], refuse)
    assert all(a is b for a, b in zip(made, again, strict=True))
