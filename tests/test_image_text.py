"""Image-text checkpoints (Gemma 3 4B and larger, Ministral 3): the language model is exported
alone."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

# google/gemma-3-4b-it's config.json (transformers 4.50 wrote it): text_config lists only
# what differs from Gemma3TextConfig's defaults, no head counts, head_dim nor vocab_size.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
    "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
        "model_type": "siglip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False,
    },
}


def test_a_hub_gemma3_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(GEMMA3_4B)
    outer = transformers.Gemma3Config.from_dict(GEMMA3_4B)
    hf = outer.get_text_config()
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.vocab_size) == (
        hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.vocab_size)
    assert ours.attn_scale == hf.query_pre_attn_scalar**-0.5
    assert [layer.window for layer in ours.layers] == [
        hf.sliding_window if kind == "sliding_attention" else None for kind in hf.layer_types]
    for name, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        rope, params = ours.ropes[name], hf.rope_parameters[kind]
        assert (rope.kind, rope.theta, rope.factor) == (
            params["rope_type"], params["rope_theta"], params.get("factor", 1.0))
    assert ours.tie_embeddings is outer.tie_word_embeddings is True
    assert ours.eos_token_ids == (1, 106)
    assert ours.final_softcap is None and ours.embed_scale == 2560**0.5


def test_the_outer_config_decides_the_tying():
    # Gemma3ForConditionalGeneration ties by its own tie_word_embeddings (true unless
    # given), whatever text_config says.
    text = {**GEMMA3_4B["text_config"], "tie_word_embeddings": False}
    assert ModelConfig.from_hf({**GEMMA3_4B, "text_config": text}).tie_embeddings
    untied = {**GEMMA3_4B, "tie_word_embeddings": False}
    assert not ModelConfig.from_hf(untied).tie_embeddings


@pytest.mark.parametrize("family", ("gemma3", "mistral3"))
def test_transformers_5_layout_exports_as_the_hub_layout(tmp_path, family):
    """transformers 5 names the language model `model.language_model.…` in memory (and in
    checkpoints some tools save from it); the Hub's are `language_model.model.…`."""
    hf_dir = build_hf_model(family, tmp_path / "hf")
    tensors = load_file(hf_dir / "model.safetensors")
    assert any(n.startswith("language_model.model.layers.") for n in tensors)
    moved = {}
    for name, tensor in tensors.items():
        for old, new in (("language_model.model.", "model.language_model."),
                         ("vision_tower.", "model.vision_tower."),
                         ("multi_modal_projector.", "model.multi_modal_projector."),
                         ("language_model.lm_head.", "lm_head.")):
            if name.startswith(old):
                name = new + name[len(old):]
                break
        moved[name] = tensor
    save_file(moved, hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ("gemma3", "mistral3", "lfm2_vl", "lfm3_vl"))
def test_the_vision_tower_is_left_out_in_one_line(tmp_path, caplog, family):
    hf_dir = build_hf_model(family, tmp_path / "hf")
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export_small(hf_dir, tmp_path / "b")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages  # no unused-tensor warning listing vision tensors
    assert "language model only" in messages[0] and "vision_tower" in messages[0]
    assert "\n" not in messages[0]
    manifest = json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())
    assert any("vision tower left out" in q for q in manifest["source"]["quirks"])


def test_lfm2_vl_exports_its_language_model_as_transformers_runs_it(tmp_path):
    """LFM2-VL: transformers 5 saves its LFM2 under `model.language_model.` (the Hub's
    layout too); the conv layers' state works as in a plain LFM2."""
    hf_dir = build_hf_model("lfm2_vl", tmp_path / "hf")
    assert any(n.startswith("model.language_model.layers.")
               for n in load_file(hf_dir / "model.safetensors"))
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("outer, expected", [
    ({}, True), ({"tie_word_embeddings": False}, False),
    ({"tie_embedding": False, "tie_word_embeddings": True}, False),  # the older name wins
])
def test_lfm2_vl_ties_as_its_outer_config_says(outer, expected):
    text = {"model_type": "lfm2", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 128, "layer_types": ["conv", "full_attention"],
            "tie_embedding": not expected}  # the language model's own say is not the model's
    raw = {"model_type": "lfm2_vl", "text_config": text, **outer}
    assert transformers.Lfm2VlConfig.from_dict(raw).tie_word_embeddings is expected
    assert ModelConfig.from_hf(raw).tie_embeddings is expected
