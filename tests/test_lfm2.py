"""LFM2: short-conv layers whose recurrent state sits beside the KV cache, computed as
transformers computes it whatever the chunking, the padding, the batch and the reuse."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions
from edgeprefill.errors import BackendError, BundleError, ExportError
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from edgeprefill.sdk.kv_cache import KVCache
from tests.fake_backend import FakeBackend, fake_manifest
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles

# The last layer convolves (as in the released LFM2s), a wider kernel, no biases.
CONV_LAST = {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
             "conv_L_cache": 4, "conv_bias": False}


@pytest.fixture(scope="module")
def conv_last(tmp_path_factory):
    """flavor -> (hf dir, bundle) of the CONV_LAST model."""
    return variant_bundles(tmp_path_factory, "lfm2", "lfm2-conv-last", CONV_LAST)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("model", ("mixed", "conv_last"))
def test_logits_equal_transformers_for_chunks_smaller_and_larger_than_the_kernel_padded(
        model, flavor, kernels, hf_model, bundle, conv_last, monkeypatch):
    """Every call's last-token logits equal transformers' at that position, for chunks of
    1 and 2 tokens (shorter than the convolution's window: the state carries it across
    several calls) up to the whole prompt, with a padded last chunk whose padding must
    stay out of the state the next call reads."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir, path = (hf_model("lfm2"), bundle("lfm2", flavor)) if model == "mixed" \
        else conv_last(flavor)
    assert_padded_chunks_match(hf_dir, path)


def conv_cache(slots: int = 3) -> KVCache:
    """A KV cache over the fake backend of a model whose first layer convolves."""
    manifest = fake_manifest()
    model = replace(manifest.model, num_layers=2, state_layers=[0])
    graph = replace(manifest.graph, state_inputs=["past_conv.0"],
                    state_outputs=["present_conv.0"],
                    inputs={**manifest.graph.inputs, "past_conv.0": ["float32", ["batch", 64, 2]]})
    backend = FakeBackend(Path("."), replace(manifest, model=model, graph=graph),
                          BackendOptions())
    return KVCache(backend, slots, 64, align=16)


def test_a_cache_with_state_reuses_a_slot_whole_or_not_at_all_without_a_snapshot():
    """No length below is a multiple of 16, so no snapshot of the states is taken (the
    fake backend would refuse to): a slot serves whole or not at all
    (test_state_snapshots.py has the reuse from a snapshot)."""
    kv = conv_cache()
    a = kv.acquire(list(range(40)), owner=1)
    kv.extend(a.slot, list(range(40)))
    kv.release(a.slot, keep=True)
    # The session's next turn extends the slot's tokens: all of them are reused.
    again = kv.acquire(list(range(50)), owner=1)
    assert (again.slot, again.reused) == (a.slot, 40)
    kv.extend(again.slot, list(range(40, 50)))
    kv.release(again.slot, keep=True)
    # A turn that rewrites the end (a common prefix of 45, but not the slot's 50): none.
    edited = kv.acquire([*range(45), 99, 98], owner=1)
    assert (edited.slot, edited.reused, edited.copied_from) == (a.slot, 0, None)
    kv.extend(edited.slot, [*range(45), 99])
    kv.release(edited.slot, keep=True)
    # Another request lends only a slot it begins with whole (its 46 tokens, unaligned).
    lent = kv.acquire([*range(45), 99, 98, 97], owner=None)
    assert (lent.reused, lent.copied_from) == (46, a.slot)
    kv.check_integrity()


def test_a_config_the_export_cannot_honour_is_refused_in_one_line(hf_model):
    raw = json.loads((hf_model("lfm2") / "config.json").read_text())
    for change, message in (({"conv_L_cache": 1}, "conv_L_cache must be at least 2"),
                            ({"layer_types": ["conv", "mamba", "conv", "full_attention"]},
                             "layer_types holds unsupported kinds: mamba"),
                            ({"layer_types": ["conv"] * 4}, "no full_attention layer")):
        with pytest.raises(ExportError, match=message) as err:
            ModelConfig.from_hf({**raw, **change})
        assert "\n" not in str(err.value)


def test_tensorrt_refuses_a_bundle_with_state_in_one_line(bundle):
    from edgeprefill.engines.trt.backend import TensorRTBackend
    from tests.trt_fakes import OrtEngineRuntime

    path = bundle("lfm2", "standard")
    manifest = load_manifest(path)
    with pytest.raises(BackendError, match="recurrent state") as err:
        TensorRTBackend(path, manifest, BackendOptions(),
                        runtime=OrtEngineRuntime(path, manifest, 128, 4))
    assert "\n" not in str(err.value)


def test_a_manifest_without_its_state_tensors_is_refused(bundle, tmp_path):
    import shutil

    path = shutil.copytree(bundle("lfm2", "ort"), tmp_path / "b")
    raw = json.loads((path / "edgeprefill.json").read_text())
    raw["graph"]["state_inputs"], raw["graph"]["state_outputs"] = [], []
    (path / "edgeprefill.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="state_inputs"):
        load_manifest(path)


def test_inspect_says_the_bundle_carries_a_conv_state(bundle):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", str(bundle("lfm2", "ort"))])
    assert result.exit_code == 0, result.output
    assert "lfm2" in result.output and "layers 0, 2 carry a recurrent state" in result.output
    assert "conv [64, 2] float32" in result.output


@pytest.mark.parametrize("keys", [
    {},  # 2/3 x 96 = 64, rounded up to 256
    {"block_multiple_of": 16, "block_ffn_dim_multiplier": 1.3},  # 83 -> 96
    {"block_auto_adjust_ff_dim": False},  # intermediate_size as given
    {"block_ff_dim": 120, "block_multiple_of": 8},  # the older name wins: 80
    {"full_attn_idxs": [2], "tie_embedding": False},  # older names of layer_types, tying
])
def test_the_config_reads_as_lfm2config_and_lfm2mlp_read_it(keys):
    import transformers

    raw = {"model_type": "lfm2", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 128, **keys}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert ours.intermediate_size == model.model.layers[0].feed_forward.w1.out_features
    assert [i for i, kind in enumerate(config.layer_types) if kind == "conv"] == \
        list(ours.conv_layers)
    assert ours.tie_embeddings == config.tie_word_embeddings


def test_a_bundle_without_state_layers_writes_and_reads_the_manifest_as_before(bundle):
    """No state field in a llama manifest: a runtime from before the conv state reads it
    without a warning, and this one reads it as every layer attention."""
    path = bundle("llama")
    raw = json.loads((path / "edgeprefill.json").read_text())
    assert "state_layers" not in raw["model"]
    assert not {"state_inputs", "state_outputs"} & set(raw["graph"])
    manifest = load_manifest(path)
    assert manifest.model.state_layers == [] and manifest.model.kv_layers == 2
    engine = Engine.load(path, threads=2, background=False)
    assert engine.backend.state is None and not engine.backend.carries_state
    engine.close()
