"""LFM3: LFM2's short-conv layers beside sliding and global attention layers, each kind with
its own rope (the global one proportional), an output gate per head and norms after each
sublayer. The fixtures (conftest.FAMILIES "lfm3", "lfm3_vl") have gate and norms on; the
generic suites (test_exactness, test_families, test_state_runtime) run them too."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import LFM3, build_hf_model
from tests.rope_tables import assert_tables_close
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

# Gate and sandwich norms off, q/k/v and o biases, the config class's conv width (7) without
# biases, tied, and a global rope that rotates a quarter of each head, its factor 2.
PLAIN = {"use_attention_gate": False, "use_sandwich_norm": False, "attention_bias": True,
         "conv_L_cache": 7, "conv_bias": False, "tie_word_embeddings": True,
         "rope_parameters": {
             "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
             "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                "partial_rotary_factor": 0.25, "factor": 2.0}}}
# LiquidAI/LFM3-1.7B's config as transformers 5.24's Lfm3Config writes it (its defaults,
# which the class documents as that checkpoint's; the Hub's file is not at hand offline).
HUB_1_7B = transformers.Lfm3Config().to_dict()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """flavor -> (hf dir, bundle) of the PLAIN model."""
    return variant_bundles(tmp_path_factory, "lfm3", "lfm3-plain", PLAIN)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("model", ("lfm3", "plain"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        model, flavor, kernels, hf_model, bundle, plain, monkeypatch):
    """Every call's last-token logits equal transformers' at that position, for chunks of
    1 to 40 tokens (the window of 8 crossed several times, the conv state carried across
    calls), with a padded last chunk whose padding must stay out of the states and KV the
    next call reads."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir, path = (hf_model(model), bundle(model, flavor)) if model == "lfm3" \
        else plain(flavor)
    assert_padded_chunks_match(hf_dir, path)


@pytest.mark.parametrize("params", [
    {"partial_rotary_factor": 0.5},
    {"partial_rotary_factor": 0.25, "factor": 4.0},
    {"partial_rotary_factor": 1.0},
    {},  # no factor: every frequency rotates
])
def test_the_proportional_rope_is_the_models(params):
    """cos of both layer kinds' tables equals Lfm3RotaryEmbedding's over head_dim 64: the
    global layers' frequencies past the rotated share are zero (cos 1), not cut off."""
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, **params}}
    raw = {"model_type": "lfm3", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
           "head_dim": 64, "vocab_size": 128, "pad_token_id": 0, "rope_parameters": rope,
           "layer_types": ["conv", "sliding_attention", "full_attention", "conv"]}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    rotary = transformers.AutoModelForCausalLM.from_config(config).model.rotary_emb
    at = torch.arange(4096)[None]
    for name, layer_type in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1), at, layer_type)
        rope_config = ours.ropes[name]
        assert rope_config.rotary_dim == 64
        freqs = np.outer(np.arange(4096, dtype=np.float32), rope_config.inv_freq())
        assert_tables_close(np.cos(freqs), cos[0, :, :32].numpy(), atol=1e-5)
        assert_tables_close(np.sin(freqs), sin[0, :, :32].numpy(), atol=1e-5)


def test_the_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_1_7B)
    hf = transformers.Lfm3Config.from_dict(HUB_1_7B)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "conv"] == \
        list(ours.conv_layers)
    assert [layer.window for i, layer in enumerate(ours.layers) if i not in ours.conv_layers] \
        == [256 if kind == "sliding_attention" else None for kind in hf.layer_types
            if kind != "conv"]
    assert [layer.rope for layer in ours.layers if layer.window] == [LOCAL] * 5
    assert (ours.ropes[GLOBAL].kind, ours.ropes[GLOBAL].theta, ours.ropes[GLOBAL].proportion,
            ours.ropes[LOCAL].kind, ours.ropes[LOCAL].theta) == (
        "proportional", 1e6, 0.5, "default", 1e4)
    assert (ours.head_dim, ours.num_kv_heads, ours.intermediate_size, ours.conv_kernel) == (
        hf.head_dim, hf.num_key_value_heads, hf.intermediate_size, hf.conv_L_cache)
    assert ours.tie_embeddings is hf.tie_word_embeddings is True
    assert ours.head_gate and ours.block == "sandwich"
    assert ours.eos_token_ids == (hf.eos_token_id,) and ours.bos_token_id == hf.bos_token_id


def test_the_hub_layout_exports_with_a_manifest_of_its_kv_and_state_layers(tmp_path):
    """The Hub config's 24 layers, layer kinds and ropes left to the config class (its
    defaults: six global, five sliding and thirteen conv layers), at the fixture's width:
    the manifest lists KV for the attention layers and a conv state for the others, and
    the logits are transformers'."""
    hf_dir = build_hf_model("lfm3", tmp_path / "hf", num_hidden_layers=24, layer_types=None,
                            rope_parameters=None)
    out = export_small(hf_dir, tmp_path / "b")
    manifest = load_manifest(out)
    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    conv = [i for i, kind in enumerate(hf.layer_types) if kind == "conv"]
    assert manifest.model.state_layers == conv and len(conv) == 13
    assert manifest.graph.state_inputs == [f"past_conv.{i}" for i in conv]
    assert [pair[0] for pair in manifest.graph.kv_inputs] == [
        f"past_key.{i}" for i in range(24) if i not in conv]
    quirks = json.loads((out / MANIFEST_FILE).read_text())["source"]["quirks"]
    assert "a sigmoid output gate per attention head" in quirks
    assert "rope (global layers): proportional (0.5 of each head's frequencies)" in quirks
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(out, ids), reference_logits(hf_dir, ids)[-1],
                               rtol=1e-4, atol=1e-4)


def test_a_checkpoint_that_names_the_gate_g_proj_exports_the_same(hf_model, tmp_path):
    """transformers saves the gate as the Hub's `gate_proj` and renames it `g_proj` when
    it loads; a checkpoint saved under the loaded name exports too."""
    import shutil

    hf_dir = shutil.copytree(hf_model("lfm3"), tmp_path / "hf")
    tensors = load_file(hf_dir / "model.safetensors")
    assert "model.layers.1.self_attn.gate_proj.weight" in tensors
    renamed = {name.replace("self_attn.gate_proj.", "self_attn.g_proj."): t
               for name, t in tensors.items()}
    save_file(renamed, hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_model("lfm3"), ids)[-1],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys", [
    {},  # 2 of every 4 layers global (none slides in 4), gate and sandwich norms on
    {"tie_embedding": False, "block_ff_dim": 80, "full_attn_idxs": [0],
     "block_auto_adjust_ff_dim": True},  # LFM2's older names: Lfm3Config reads none
    {"use_sandwich_norm": False, "use_attention_gate": False, "num_hidden_layers": 9},
])
def test_the_config_reads_as_lfm3config_and_its_model_read_it(keys):
    raw = {"model_type": "lfm3", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 128, "pad_token_id": 0, "eos_token_id": 2, **keys}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(config)
    layer = model.model.layers[2]
    assert ours.intermediate_size == layer.feed_forward.w1.out_features
    assert [i for i, kind in enumerate(config.layer_types) if kind == "conv"] == \
        list(ours.conv_layers)
    assert [layer.window is not None for layer in ours.layers] == [
        kind == "sliding_attention" for kind in config.layer_types]
    assert ours.tie_embeddings == config.tie_word_embeddings
    assert ours.head_gate == (layer.self_attn.g_proj is not None)
    assert (ours.block == "sandwich") == isinstance(layer.post_ffn_norm,
                                                    transformers.models.lfm3.modeling_lfm3
                                                    .Lfm3RMSNorm)


@pytest.mark.parametrize("outer, expected", [
    ({}, True), ({"tie_word_embeddings": False}, False),
    ({"tie_embedding": False}, True),  # LFM2-VL's older name: Lfm3VlConfig has none
])
def test_lfm3_vl_ties_as_its_outer_config_says(outer, expected):
    text = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
            "tie_word_embeddings": not expected}  # the language model's say is not the model's
    raw = {"model_type": "lfm3_vl", "text_config": text, **outer}
    assert transformers.Lfm3VlConfig.from_dict(raw).tie_word_embeddings is expected
    assert ModelConfig.from_hf(raw).tie_embeddings is expected


@pytest.mark.parametrize("raw, message", [
    ({"model_type": "lfm3", "layer_types": ["conv", "linear_attention", "full_attention",
                                            "conv"]},
     "layer_types holds unsupported kinds: linear_attention"),
    ({"model_type": "lfm3_vl", "text_config": {"model_type": "lfm2"}},
     "text_config model_type 'lfm2' is not supported; supported: lfm3"),
    ({"model_type": "lfm3", "sliding_window": None,
      "layer_types": ["conv", "sliding_attention", "full_attention", "conv"]},
     "lfm3: layer_types has sliding_attention layers but sliding_window is null"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "proportional"}},
     "llama: rope type 'proportional' is not supported by this family's model"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(raw, message):
    sizes = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
             "num_attention_heads": 4, "vocab_size": 128}
    nested = raw.get("text_config")
    raw = {**raw, "text_config": {**sizes, **nested}} if nested else {**sizes, **raw}
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)


def test_the_fixture_slides_gates_and_sandwiches():
    """What the generic suites test on conftest's "lfm3" is what this file says it is."""
    ours = ModelConfig.from_hf({"model_type": "lfm3", "hidden_size": 64,
                                "intermediate_size": 96, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "vocab_size": 128, **LFM3})
    assert [layer.window for layer in ours.layers] == [None, 8, None, None]
    assert ours.conv_layers == (0, 3) and ours.head_gate and ours.block == "sandwich"
