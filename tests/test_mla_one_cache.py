"""Multi-head latent attention's one cache per layer (graph.value_is_key,
engines/ort/value_cache.py): an ort bundle's value is its key, so ONNX Runtime's CPU
provider binds one buffer as both caches. The logits against transformers run in
test_exactness and test_mla on these bundles; here: the same bits as two buffers, half the
memory, prefix reuse and slot moves, and what is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.cli.main import cli
from edgeprefill.engines import create_backend
from edgeprefill.engines.base import BackendOptions, kv_slot_bytes
from edgeprefill.errors import BackendError, BundleError
from edgeprefill.sdk import Engine
from edgeprefill.sdk.params import GenerationParams
from tests.state_models import assert_copy_and_swap_continue, run_padded
from tests.test_exactness import NEW_TOKENS, prompt_ids, reference_greedy, reference_logits

FAMILY = "minicpm3"  # 2 layers, one KV head of 16 + 32
LAYERS, PER_CACHE = 2, 1 * 128 * 48 * 4  # a layer's K (or V) at capacity 128, float32


def edited(path, out, **graph):
    """A copy at `out` of the bundle at `path` whose manifest's graph has the fields
    `graph` (None: the field left out, as in bundles exported before it)."""
    shutil.copytree(path, out)
    raw = json.loads((out / MANIFEST_FILE).read_text())
    for key, value in graph.items():
        raw["graph"].pop(key, None)
        if value is not None:
            raw["graph"][key] = value
    (out / MANIFEST_FILE).write_text(json.dumps(raw))
    return out


@pytest.fixture(scope="module")
def two_caches(bundle, tmp_path_factory):
    """The MLA ort bundle as exported before graph.value_is_key: a K and a V buffer."""
    return edited(bundle(FAMILY), tmp_path_factory.mktemp("mla") / "two", value_is_key=None)


def test_the_ort_flavour_marks_every_layer_and_the_standard_one_none(bundle):
    """TensorRT runs the standard flavour: it keeps a buffer per cache."""
    ort = load_manifest(bundle(FAMILY))
    assert ort.graph.value_is_key == list(range(ort.model.num_layers)) == [0, 1]
    raw = json.loads((bundle(FAMILY, "standard") / MANIFEST_FILE).read_text())
    assert "value_is_key" not in raw["graph"]
    assert load_manifest(bundle(FAMILY, "standard")).graph.value_is_key == []


def test_one_buffer_per_layer_takes_half_the_bytes_and_gives_the_same_logits(
        bundle, two_caches, hf_model):
    """Chunks of 16, the last one padded, then the rest: the same bits from one buffer as
    from two, both transformers' logits; the arena and the KV budget's slot size halved."""
    ids = prompt_ids(30)
    expected = reference_logits(hf_model(FAMILY), ids)
    got, sizes = {}, {}
    for name, path in (("one", bundle(FAMILY)), ("two", two_caches)):
        with Engine.load(path, threads=2, background=False, kv_slots=2,
                         max_context=128) as engine:
            backend = engine.backend
            sizes[name] = (sum(a.nbytes for a in backend.kv_arrays()),
                           backend.kv_slot_bytes(128), len(backend.kv_arrays()))
            got[name] = run_padded(backend, ids, 16, split=30)
    assert sizes["one"] == (2 * LAYERS * PER_CACHE, LAYERS * PER_CACHE, LAYERS)
    assert sizes["two"] == (2 * 2 * LAYERS * PER_CACHE, 2 * LAYERS * PER_CACHE, 2 * LAYERS)
    for position, logits in got["one"].items():
        np.testing.assert_array_equal(logits, got["two"][position])
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)
    manifest = load_manifest(bundle(FAMILY))
    assert kv_slot_bytes(manifest.model, 128, np.float32, 0,
                         manifest.graph.value_is_key) == LAYERS * PER_CACHE


def test_inspect_counts_one_cache(bundle, two_caches):
    """2 layers x 512 positions x 48 floats: 0.2 MB a slot, 0.4 MB with two caches."""
    def kv_line(path) -> str:
        out = CliRunner().invoke(cli, ["inspect", str(path)]).output
        return next(line for line in out.splitlines() if line.startswith("kv cache"))

    one, two = kv_line(bundle(FAMILY)), kv_line(two_caches)
    assert one.startswith("kv cache    0.2 MB per slot of 512 positions (float32)")
    assert one.endswith("; one cache per layer, its value the key (on a GPU: 0.4 MB, two)")
    assert two.startswith("kv cache    0.4 MB per slot") and "one cache" not in two


def test_a_kv_budget_holds_twice_the_slots(bundle, two_caches):
    budget = 4 * LAYERS * PER_CACHE  # two slots of two caches a layer, at capacity 128
    for path, slots in ((bundle(FAMILY), 4), (two_caches, 2)):
        with Engine.load(path, threads=2, background=False, max_context=128,
                         kv_budget_bytes=budget) as engine:
            assert len(engine.kv.slots) == slots


def test_copying_and_swapping_a_slot_moves_its_one_cache(bundle, hf_model):
    """Prefix lending copies a slot, keeping decode rows adjacent swaps two: copying and
    swapping the one buffer suffices for the next chunk to continue as transformers does."""
    with Engine.load(bundle(FAMILY), threads=2, background=False) as engine:
        assert_copy_and_swap_continue(engine, hf_model(FAMILY))


def test_a_reused_prefix_continues_as_transformers_greedy_text(bundle, hf_model):
    """The second prompt shares the first's 40 tokens: it reuses 32 of them (chunk
    aligned) from the one cache, and its reply is transformers' greedy one."""
    hf_dir = hf_model(FAMILY)
    shared = prompt_ids(40)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    with Engine.load(bundle(FAMILY), threads=2, background=False, chunk_size=16) as engine:
        first = shared + prompt_ids(10, seed=5)[1:]
        second = shared + prompt_ids(10, seed=6)[1:]
        assert engine.generate(first, params).result().token_ids == \
            reference_greedy(hf_dir, first)
        stream = engine.generate(second, params)
        assert stream.result().token_ids == reference_greedy(hf_dir, second)
        assert stream.metrics.prefix_reused == 32


def test_the_old_two_cache_bundle_runs_as_before(two_caches, hf_model):
    hf_dir = hf_model(FAMILY)
    ids = prompt_ids(30, seed=3)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    with Engine.load(two_caches, threads=2, background=False) as engine:
        assert engine.backend.value_is_key == []
        assert engine.generate(ids, params).result().token_ids == reference_greedy(hf_dir, ids)


def test_a_layer_whose_attention_writes_another_value_is_refused_in_one_line(bundle,
                                                                             tmp_path):
    """A manifest edited to mark llama's layers: its value cache holds v, not k."""
    path = edited(bundle("llama"), tmp_path / "b", value_is_key=[0])
    with pytest.raises(BackendError, match=r"^the manifest's graph.value_is_key lists layer "
                                           r"0, but its attention does not write its key as "
                                           r"its value; re-export the bundle$"):
        create_backend("onnxruntime", path, load_manifest(path), BackendOptions())


@pytest.mark.parametrize("flavor, layers, message", [
    ("ort", [1, 0], r"graph.value_is_key \[1, 0\] must be distinct layers with KV in "
                    r"ascending order"),
    ("ort", [2], r"graph.value_is_key \[2\] must be distinct layers with KV"),
    ("standard", [0, 1], r"graph.value_is_key is for the ort flavour only, not 'standard'"),
])
def test_a_malformed_value_is_key_is_refused_in_one_line(flavor, layers, message, bundle,
                                                         tmp_path):
    """The standard flavour, which TensorRT runs, binds a buffer per cache."""
    path = edited(bundle(FAMILY, flavor), tmp_path / "b", value_is_key=layers)
    with pytest.raises(BundleError, match=f"^{MANIFEST_FILE} is malformed: {message}"):
        load_manifest(path)


def test_the_tensorrt_backend_refuses_the_one_cache_bundle_in_one_line(bundle):
    """It runs the standard flavour only, whose manifest never holds the field (above)."""
    from edgeprefill.engines.trt.backend import TensorRTBackend

    path = bundle(FAMILY)
    with pytest.raises(BackendError, match=r"^this bundle holds the 'ort' graph flavour, "
                                           r"which TensorRT cannot parse"):
        TensorRTBackend(path, load_manifest(path), BackendOptions(device="tensorrt"))
