"""Falcon-H1: attention and a Mamba-2 mixer side by side in every layer, so each layer
keeps its KV and both states (`model.kv_state_layers`), with muP multipliers on both
mixers and the MLP. The fixture (conftest.FAMILIES "falcon_h1") sets every multiplier
away from 1; the generic suites and test_state_runtime.py run it too."""

from __future__ import annotations

import json
import shutil

import pytest
import transformers
from click.testing import CliRunner

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.cli.main import cli
from edgeprefill.errors import BundleError, ExportError
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import FAMILIES
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles

# The mixer's other norms (none: y * silu(z); or the norm before the gate) and every bias.
NO_NORM = {**FAMILIES["falcon_h1"], "mamba_rms_norm": False}
NORM_FIRST = {**FAMILIES["falcon_h1"], "mamba_norm_before_gate": True, "attention_bias": True,
              "projectors_bias": True, "mamba_proj_bias": True, "mamba_conv_bias": False}
# tiiuae/Falcon-H1-0.5B-Instruct's config.json as we know its shape (the Hub was not
# reachable here; the multipliers are illustrative): what matters is that ours reads them
# as FalconH1Config does.
HUB_0_5B = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1",
    "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 36,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 128,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 128,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_rms_norm": False,
    "mamba_norm_before_gate": False, "projectors_bias": False, "attention_bias": False,
    "mlp_bias": False, "rms_norm_eps": 1e-05, "rope_theta": 100000000000.0,
    "max_position_embeddings": 16384, "vocab_size": 32784, "tie_word_embeddings": False,
    "embedding_multiplier": 5.656854249492381, "lm_head_multiplier": 0.0390625,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375,
    "key_multiplier": 0.390625, "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5,
                        0.3535533905932738],
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
}


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    made = {"no_norm": variant_bundles(tmp_path_factory, "falcon_h1", "fh1-no-norm", NO_NORM),
            "norm_first": variant_bundles(tmp_path_factory, "falcon_h1", "fh1-norm-first",
                                          NORM_FIRST)}
    return lambda name, flavor: made[name](flavor)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("model", ("falcon_h1", "no_norm", "norm_first"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        model, flavor, kernels, hf_model, bundle, variants, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir, path = (hf_model(model), bundle(model, flavor)) if model == "falcon_h1" \
        else variants(model, flavor)
    assert_padded_chunks_match(hf_dir, path)


def test_every_layer_keeps_its_kv_beside_both_states(bundle):
    manifest = load_manifest(bundle("falcon_h1"))
    assert manifest.model.state_layers == manifest.model.kv_state_layers == [0, 1]
    assert manifest.model.kv_layers == 2
    assert manifest.graph.kv_inputs == [["past_key.0", "past_value.0"],
                                        ["past_key.1", "past_value.1"]]
    assert manifest.graph.state_inputs == ["past_conv.0", "past_recurrent.0", "past_conv.1",
                                           "past_recurrent.1"]
    result = CliRunner().invoke(cli, ["inspect", str(bundle("falcon_h1"))])
    assert result.exit_code == 0, result.output
    assert "layers 0, 1 carry a recurrent state beside their KV" in result.output


def test_a_manifest_whose_kv_state_layers_are_no_state_layers_is_refused(bundle, tmp_path):
    path = shutil.copytree(bundle("falcon_h1"), tmp_path / "b")
    raw = json.loads((path / MANIFEST_FILE).read_text())
    raw["model"]["kv_state_layers"] = [0, 2]
    (path / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"model.kv_state_layers \[0, 2\] must be distinct "
                                          "state layers") as err:
        load_manifest(path)
    assert "\n" not in str(err.value)


def test_other_state_models_write_no_kv_state_layers(bundle):
    """A runtime from before Falcon-H1 reads an LFM2 or Granite 4.0-H bundle without an
    unknown-field warning."""
    for family in ("lfm2", "granitemoehybrid-mamba"):
        raw = json.loads((bundle(family) / MANIFEST_FILE).read_text())
        assert "kv_state_layers" not in raw["model"] and raw["model"]["state_layers"]


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_0_5B)
    hf = transformers.FalconH1Config.from_dict(HUB_0_5B)
    assert ours.mamba_layers == ours.kv_state_layers == tuple(range(36))
    m, s = ours.mamba, ours.scales
    assert m is not None and s is not None
    assert (m.heads, m.head_dim, m.groups, m.state_size, m.conv_kernel, m.norm) == (
        hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_n_groups, hf.mamba_d_state,
        hf.mamba_d_conv, None)
    assert (s.attention_in, s.attention_out, s.key, s.ssm_in, s.ssm_out) == (
        hf.attention_in_multiplier, hf.attention_out_multiplier, hf.key_multiplier,
        hf.ssm_in_multiplier, hf.ssm_out_multiplier)
    assert list(s.ssm) == list(hf.ssm_multipliers) and list(s.mlp) == list(hf.mlp_multipliers)
    assert ours.embed_scale == hf.embedding_multiplier
    assert ours.logits_multiplier == hf.lm_head_multiplier
    assert ours.ropes["global"].theta == 1e11


@pytest.mark.parametrize("change, message", [
    ({"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers must hold 5 values"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"mamba_n_groups": 3}, "a multiple of mamba_n_groups"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = json.loads((hf_model("falcon_h1") / "config.json").read_text())
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**raw, **change})
    assert "\n" not in str(err.value)
