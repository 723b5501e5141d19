"""Muse Glimmer's language model (export/families/muse.py): its normed embedding, Gemma 2's
sandwich of (1 + w) norms with post-sublayer norms at their own epsilon, weightless q/k
norms with q scaled, a sigmoid output gate of its own projection, NoPE full layers beside
sliding ones, a final x * w norm and the logits scaled before the soft-cap. Its fixture
(conftest.FAMILIES "muse_glimmer", MuseGlimmerForConditionalGeneration with a tiny vision
tower) runs in the generic suites too (test_exactness, test_families). Here: the config
read as transformers builds the model, the Hub's config shape, chunked prefill with a
padded chunk and decode, rows of different lengths in one call, int4 and int8 bundles,
each piece shown to matter (export without it and the logits leave transformers'), and
what export refuses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export import families
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import muse
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, IMAGE_TEXT
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_moe import run_rows
from tests.test_quantize import (
    check_int4_logits,
    check_int8_decode_steps,
    logits_at,
)

MINIMAL = {"model_type": "muse_glimmer_text", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2}
VISION = IMAGE_TEXT["muse_glimmer"]
# meta-models/Muse-Glimmer-30B's config.json as its config class writes it (the Hub was
# not reachable here): the outer keys, text_config with its class's values.
HUB_30B = {
    "architectures": ["MuseGlimmerForConditionalGeneration"], "model_type": "muse_glimmer",
    "image_token_id": 200092, "video_token_id": 200091, "out_hidden_size": 6144,
    "projector_hidden_size": 4096, "projector_hidden_act": "gelu",
    "text_config": {"model_type": "muse_glimmer_text", "vocab_size": 202048,
                    "hidden_size": 6656, "intermediate_size": 19968,
                    "num_hidden_layers": 52, "num_attention_heads": 32,
                    "num_key_value_heads": 2, "head_dim": 128, "hidden_activation": "silu",
                    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
                    "bos_token_id": 200000, "eos_token_id": 200001,
                    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                    "sliding_window": 2048, "final_logit_softcapping": 20.0,
                    "qk_scale_factor": 3.87, "output_multiplier": 0.19611613513818404,
                    "post_norm_eps": 1e-08},
    "vision_config": {"model_type": "muse_glimmer_vision"},
}


def meta_model(text: dict, **outer):
    config = transformers.AutoConfig.for_model("muse_glimmer", text_config=text, **VISION,
                                               **outer)
    with torch.device("meta"):
        return config, transformers.AutoModelForImageTextToText.from_config(config)


@pytest.mark.parametrize("keys", [
    FAMILIES["muse_glimmer"],
    {},  # the config class's lists and scales
    {"num_hidden_layers": 5, "sliding_window": 4, "qk_scale_factor": 2.0,
     "layer_types": ["full_attention", "sliding_attention"] * 2 + ["full_attention"],
     "layer_rope_theta": [0, 1e4, 1e4, 0, 5e5], "rms_norm_eps": 1e-3},
], ids=["fixture", "defaults", "lists"])
def test_muse_glimmer_reads_as_transformers_builds_its_layers(keys):
    """Each layer's window and rotary, the q/k norms' and post-sublayer norms' epsilons,
    q's factor, the logits' scale and soft-cap, and the tying, as the model has them."""
    text = {**MINIMAL, **keys}
    ours = ModelConfig.from_hf({"model_type": "muse_glimmer", "text_config": text})
    config, model = meta_model(text)
    hf = config.text_config
    layers = model.model.language_model.layers
    assert [layer.window for layer in ours.layers] == [
        each.self_attn.sliding_window for each in layers]
    assert [layer.rope is not None for layer in ours.layers] == [
        bool(theta) for theta in hf.layer_rope_theta]
    attention = layers[0].self_attn
    assert ours.attn_scale == pytest.approx(attention.scaling * attention.qk_scale_factor)
    assert ours.norm_eps == attention.qk_norm.eps == layers[0].input_layernorm.eps
    assert ours.post_norm_eps == layers[0].post_attention_layernorm.eps \
        == layers[0].post_feedforward_layernorm.eps
    assert (ours.logits_multiplier, ours.final_softcap) == (
        hf.output_multiplier, hf.final_logit_softcapping)
    assert not ours.tie_embeddings and model.lm_head.weight is not \
        model.model.language_model.embed_tokens.weight


def test_the_outer_configs_key_ties_as_transformers_ties():
    """Only the outer config's tie_word_embeddings ties (its class has none: untied)."""
    for outer, inner in ((None, True), (True, False)):
        text = {**MINIMAL, "tie_word_embeddings": inner}
        raw = {"model_type": "muse_glimmer", "text_config": text}
        extra = {} if outer is None else {"tie_word_embeddings": outer}
        _, model = meta_model(text, **extra)
        tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
        assert ModelConfig.from_hf({**raw, **extra}).tie_embeddings is tied is bool(outer)


def test_the_hubs_config_reads_as_transformers_reads_it():
    """Muse-Glimmer-30B's shape: 52 layers, every 4th from the last full and NoPE, the
    others sliding over 2048, q.k times 3.87 / sqrt(128), untied."""
    ours = ModelConfig.from_hf(HUB_30B)
    hf = transformers.AutoConfig.for_model(**HUB_30B).text_config
    assert [layer.window is None for layer in ours.layers] == [
        kind == "full_attention" for kind in hf.layer_types]
    assert [layer.rope is None for layer in ours.layers] == [
        theta == 0 for theta in hf.layer_rope_theta]
    assert sum(layer.rope is None for layer in ours.layers) == 13
    assert ours.attn_scale == pytest.approx(3.87 / 128**0.5)
    assert (ours.num_layers, ours.head_dim, ours.num_kv_heads) == (52, 128, 2)
    assert not ours.tie_embeddings and ours.eos_token_ids == (200001,)
    assert ours.post_norm_eps == 1e-8


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Chunks of 1, 2, 3, 16 and 40 tokens (decode steps among them), the last before the
    split padded: every call's logits are transformers' at that token, across the window;
    with the native kernels (their fused norms read each norm's own epsilon) and without."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("muse_glimmer"), bundle("muse_glimmer", flavor))


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        flavor, hf_model, bundle):
    """One call of three rows (a 9-token chunk, a decode token, 4 tokens)."""
    hf_dir = hf_model("muse_glimmer")
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(bundle("muse_glimmer", flavor), threads=2, background=False,
                         kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


def test_int4_equals_transformers_with_dequantized_weights(hf_model, tmp_path):
    """int4 at float compute: every projection (q/k/v, the gate, o, the MLP, the LM head)
    and the untied table as the bundle stores them."""
    check_int4_logits(hf_model("muse_glimmer"), tmp_path, prompt_ids(20))


def test_int8_decode_steps_equal_transformers_with_int8_projections(hf_model, tmp_path):
    """int8: every projection (q/k/v, the gate, o, the MLP, the LM head) on per-channel
    int8 weights with its input quantized on the fly, and the untied table as the bundle
    stores them. The bundle runs one token per call (as decode does), where the op's
    quantization of the whole input is that of each row, as the reference's. (Against
    fp32 the bundle drifts 24% of the logits' range on the fixture: the q/k norms and q's
    factor of 3.87 sharpen the scores, and so the projections' rounding.)"""
    hf_dir = hf_model("muse_glimmer")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    check_int8_decode_steps(hf_dir, tmp_path / "b", prompt_ids(20))


def _without_scale(key: str):
    """The family's config reading with one of its scales left at export's default."""
    def read(raw: dict) -> dict:
        return {k: v for k, v in muse._glimmer_config(raw).items() if k != key}
    return read


# Each piece of the family taken out of the export: its logits must then leave
# transformers' (the comparison above fails without it).
BROKEN = {
    "normed embedding": {"embed_norm_weightless": False},
    "weightless q/k norms": {"qk_norm": None},
    "q's factor": {"legacy": _without_scale("attention_multiplier")},
    "output gate": {"attn_gate": False},
    "post-sublayer norms' eps": {"post_norm_eps_key": None},
    "final norm x * w": {"final_norm_kind": None},
    "logits' scale": {"legacy": _without_scale("logit_scale")},
}


@pytest.mark.parametrize("piece", BROKEN)
def test_each_piece_matters(piece, hf_model, tmp_path, monkeypatch):
    hf_dir = hf_model("muse_glimmer")
    monkeypatch.setitem(families.FAMILIES, "muse_glimmer",
                        replace(muse.MUSE_GLIMMER, **BROKEN[piece]))
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    ids = prompt_ids(24)
    assert np.abs(logits_at(tmp_path / "b", ids) - reference_logits(hf_dir, ids)[-1]
                  ).max() > 1e-2


@pytest.mark.parametrize("keys, message", [
    ({"layer_rope_theta": [1e4, 0]}, "layer_rope_theta lists 2 layers; num_hidden_layers is 4"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"post_norm_eps": -1e-8}, "post_norm_eps must be positive, got -1e-08"),
    ({"model_type": "llama"}, "text_config model_type 'llama' is not supported"),
])
def test_what_muse_glimmer_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "muse_glimmer",
                             "text_config": {**MINIMAL, **keys}})
    assert "\n" not in str(refused.value)
