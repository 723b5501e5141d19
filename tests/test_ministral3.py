"""Ministral 3 (bare `ministral3`, and the Hub's image-text `mistral3`): Llama 4's query
scale, its config as transformers reads it, and the checkpoints export refuses. The
logits of both fixtures against transformers, chunked, in both flavours: test_exactness."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.query_scale import QueryScale
from tests.conftest import build_hf_model
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

# Shaped as mistralai/Ministral-3-3B-Instruct-2512's config.json (the vision config cut
# down): the language model in text_config, Llama 4's beta in the yarn rope dict.
MINISTRAL3_3B = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "image_token_index": 10, "spatial_merge_size": 2, "tie_word_embeddings": True,
    "text_config": {
        "model_type": "ministral3", "head_dim": 128, "hidden_size": 3072,
        "intermediate_size": 9216, "max_position_embeddings": 262144,
        "num_attention_heads": 32, "num_hidden_layers": 26, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "sliding_window": None, "vocab_size": 131072,
        "rope_parameters": {
            "rope_type": "yarn", "type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
            "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
    },
    "vision_config": {"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8},
}


def test_a_hub_ministral3_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(MINISTRAL3_3B)
    outer = transformers.Mistral3Config.from_dict(MINISTRAL3_3B)
    hf = outer.get_text_config()
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    rope, params = ours.ropes[GLOBAL], hf.rope_parameters
    assert (rope.kind, rope.theta, rope.factor, rope.original_max_positions) == (
        params["rope_type"], params["rope_theta"], params["factor"],
        params["original_max_position_embeddings"])
    assert ours.query_scale == QueryScale(params["llama_4_scaling_beta"],
                                          params["original_max_position_embeddings"])
    assert all(layer.window is None for layer in ours.layers)
    assert ours.tie_embeddings is outer.tie_word_embeddings is True


def test_the_query_scale_is_transformers_factor_across_its_steps():
    """The factor the graph computes (in float32, as the model) at positions around the
    steps of the Hub's 16384-position window, up to the 262144 the config allows."""
    import onnxruntime as ort

    from edgeprefill.export.graph import GraphBuilder

    at = np.array([[0, 16383, 16384, 32767, 32768, 49152, 131071, 131072, 262143]])
    g = GraphBuilder()
    positions = g.input("positions", np.int64, [1, at.shape[1]])
    g.output("scale", np.float32, [1, at.shape[1], 1])
    g.rename(QueryScale(0.1, 16384).emit(g, positions, np.float32), "scale")
    model = g.to_model([], {"": 21}, 10).SerializeToString()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (ours,) = session.run(None, {"positions": at})
    want = get_llama_4_attn_scale(torch.tensor(at), 0.1, 16384)  # [1, 1, C, 1]
    np.testing.assert_allclose(ours[0, :, 0], want[0, 0, :, 0].numpy(), rtol=1e-6)


def test_the_fixtures_query_scale_changes_transformers_logits(tmp_path):
    """Guards the fixture: its original window of 8 makes the factor vary within the test
    prompts, so the exactness tests would catch a graph without it."""
    ids = prompt_ids(100)
    scaled = reference_logits(build_hf_model("ministral3", tmp_path / "a"), ids)
    rope = json.loads((tmp_path / "a" / "config.json").read_text())["rope_parameters"]
    plain = reference_logits(build_hf_model(
        "ministral3", tmp_path / "b", rope_parameters={**rope, "llama_4_scaling_beta": 0.0}), ids)
    assert np.abs(scaled[:8] - plain[:8]).max() == 0  # the factor is 1 before position 8
    assert np.abs(scaled - plain).max() > 1e-1


def assert_layer_types_export_as_transformers(tmp_path, family: str, flavor: str) -> None:
    hf_dir = build_hf_model(family, tmp_path / "hf", sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"])
    ids = prompt_ids(40)
    out = export_small(hf_dir, tmp_path / "b", flavor)
    np.testing.assert_allclose(last_logits(out, ids), reference_logits(hf_dir, ids)[-1],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_every_layer_slides_whatever_layer_types_say(tmp_path, flavor):
    # MistralModel's mask slides every layer where the config has a window; Ministral3Config
    # only warns of a layer_types key.
    assert_layer_types_export_as_transformers(tmp_path, "ministral3", flavor)


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_a_mistral_config_with_layer_types_slides_as_automodel_builds_it(tmp_path, flavor):
    # Ministral 8B's Hub config says "mistral" with layer_types: AutoModel builds it as
    # MinistralForCausalLM, which slides the layers layer_types marks, and so does export.
    assert_layer_types_export_as_transformers(tmp_path, "mistral", flavor)


@pytest.mark.parametrize("text", ({"model_type": "mistral"}, {}))
def test_a_mistral_language_model_in_mistral3_reads_as_a_mistral(text):
    # Mistral Small 3.1's text_config is a Mistral (no query scale); without a model_type
    # Mistral3Config takes it for one too (families/wrapped.py).
    inner = {k: v for k, v in MINISTRAL3_3B["text_config"].items()
             if k not in ("model_type", "rope_parameters")}
    raw = {**MINISTRAL3_3B, "text_config": {**inner, **text}}
    ours = ModelConfig.from_hf(raw)
    assert transformers.Mistral3Config.from_dict(raw).text_config.model_type == "mistral"
    assert (ours.text_type, ours.query_scale, ours.tie_embeddings) == ("mistral", None, True)


@pytest.mark.parametrize("key", ("llama_4_scaling_beta", "original_max_position_embeddings"))
def test_a_default_rope_without_the_query_scales_keys_is_refused(key):
    # transformers' attention fails on them (None in arithmetic); yarn fills in the window.
    rope = {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 16384}
    raw = {**MINISTRAL3_3B["text_config"], "rope_parameters": {
        k: v for k, v in rope.items() if k != key}}
    with pytest.raises(ExportError, match=f"ministral3: the rope parameters need {key}"):
        ModelConfig.from_hf(raw)
