"""Molmo 2's language model (export/families/molmo2.py): the Hub's fused att_proj and
[up | gate] ff_proj, its embedding stored as two tables joined (export/joined_tensors.py),
per-layer rope scaling (export/unscaled_rope.py), q/k norms per head or over the whole
projection (qk_norm_type) and post-norm layers (norm_after). Its fixture
(conftest.FAMILIES "molmo2", Molmo2ForConditionalGeneration with a tiny vision backbone,
saved by transformers in the Hub's layout) runs in the generic suites too. Here: the
config read as transformers builds the model, the Hub's config shape, chunked prefill with
a padded chunk and decode, rows of different lengths in one call, the extra vocabulary's
rows, int4 and int8 bundles, each piece shown to matter (export without it and the logits
leave transformers'), and what export refuses."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from edgeprefill.errors import ExportError, RequestError
from edgeprefill.export import families
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import molmo2
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import FAMILIES, IMAGE_TEXT, VOCAB, build_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, run_padded
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_moe import run_rows
from tests.test_quantize import (
    check_int4_logits,
    check_int8_decode_steps,
    logits_at,
)

MINIMAL = {"model_type": "molmo2_text", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 128, "additional_vocab_size": 8}
TOWERS = IMAGE_TEXT["molmo2"]
# allenai/Molmo2-8B's config.json in the shape its remote code writes it (the Hub was not
# reachable here): the legacy keys transformers 5.24 reads (vit_config, qkv_bias,
# layer_norm_eps, rope_theta and rope_scaling) and use_qk_norm, which it ignores.
HUB_8B = {
    "architectures": ["Molmo2ForConditionalGeneration"], "model_type": "molmo2",
    "image_start_token_id": 151936, "image_end_token_id": 151937, "image_patch_id": 151938,
    "low_res_image_start_token_id": 151940, "frame_start_token_id": 151943,
    "frame_end_token_id": 151944, "tie_word_embeddings": False,
    "text_config": {"model_type": "molmo2_text", "hidden_size": 4096,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 151936, "additional_vocab_size": 128, "qkv_bias": False,
                    "num_hidden_layers": 36, "intermediate_size": 12288,
                    "hidden_act": "silu", "max_position_embeddings": 36864,
                    "rope_theta": 1000000.0, "rope_scaling": None,
                    "rope_scaling_layers": None, "use_qk_norm": True,
                    "qk_norm_type": "qwen3", "layer_norm_eps": 1e-06, "norm_after": False,
                    "tie_word_embeddings": False},
    "vit_config": {"model_type": "molmo2_vision"}, "adapter_config": {},
}


def meta_model(text: dict):
    config = transformers.AutoConfig.for_model("molmo2", text_config=text, **TOWERS)
    with torch.device("meta"):
        return config, transformers.AutoModelForImageTextToText.from_config(config)


@pytest.mark.parametrize("keys", [
    FAMILIES["molmo2"],
    {},  # the config class's defaults: every layer on the one rope
    {"qk_norm_type": "olmo", "norm_after": True, "attention_bias": True,
     "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5},
     "rope_scaling_layers": [1]},
], ids=["fixture", "defaults", "olmo"])
def test_molmo2_reads_as_transformers_builds_its_layers(keys):
    """Each layer's rope (scaled or the default of the same theta), the q/k norms' kind,
    the block, the biases, the extra rows and the tying, as the model has them."""
    text = {**MINIMAL, **keys}
    ours = ModelConfig.from_hf({"model_type": "molmo2", "text_config": text})
    config, model = meta_model(text)
    lm = model.model.language_model
    assert [LOCAL if kind == "unscaled" else GLOBAL for kind in lm.rope_types] == [
        layer.rope for layer in ours.layers]
    assert ours.ropes[GLOBAL].kind == lm.rotary_emb.rope_type
    assert ours.ropes[LOCAL].kind == lm.rotary_emb_unscaled.rope_type == "default"
    assert ours.ropes[LOCAL].theta == ours.ropes[GLOBAL].theta == \
        config.text_config.rope_parameters["rope_theta"]
    attention = lm.layers[0].self_attn
    assert ours.qk_norm == ("head" if attention.q_norm.weight.shape[0] == 16 else "full")
    assert ours.block == ("post" if lm.layers[0].norm_after else "pre")
    assert ours.qkv_bias == (attention.q_proj.bias is not None)
    assert ours.embed_extra_rows == lm.embed_tokens.num_embeddings - ours.vocab_size
    assert not ours.tie_embeddings


def test_the_hubs_config_reads_as_transformers_reads_it():
    """Molmo2-8B's shape: 36 layers of 32 heads over 8 KV heads, per-head q/k norms,
    theta 1e6 on every layer, 128 extra rows, untied."""
    ours = ModelConfig.from_hf(HUB_8B)
    hf = transformers.AutoConfig.for_model(**HUB_8B).text_config
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    assert ours.norm_eps == hf.rms_norm_eps and ours.qkv_bias is hf.attention_bias is False
    assert ours.ropes[GLOBAL].theta == hf.rope_parameters["rope_theta"] == 1e6
    assert {layer.rope for layer in ours.layers} == {GLOBAL}
    assert ours.qk_norm == "head" and ours.embed_extra_rows == 128
    assert not ours.tie_embeddings


def test_the_hubs_scaled_layers_read_as_transformers_reads_them():
    """The Hub's rope_scaling (yarn) and rope_scaling_layers: the listed layers on yarn,
    the others on the default rope of the same theta."""
    text = {**HUB_8B["text_config"], "num_hidden_layers": 4, "rope_scaling_layers": [0, 3],
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    ours = ModelConfig.from_hf({**HUB_8B, "text_config": text})
    hf = transformers.AutoConfig.for_model(**{**HUB_8B, "text_config": text}).text_config
    assert [layer.rope for layer in ours.layers] == [GLOBAL, LOCAL, LOCAL, GLOBAL]
    assert (ours.ropes[GLOBAL].kind, ours.ropes[GLOBAL].factor) == ("yarn", 4.0)
    assert ours.ropes[GLOBAL].theta == hf.rope_parameters["rope_theta"] == 1e6
    assert ours.ropes[GLOBAL].original_max_positions == \
        hf.rope_parameters["original_max_position_embeddings"]


def test_the_fixture_is_stored_as_the_hub_stores_it(hf_model):
    """transformers 5.24 saves Molmo 2 in the Hub's layout: the fused projections and the
    two embedding tables that export reads (its vision backbone beside them)."""
    from safetensors import safe_open

    with safe_open(hf_model("molmo2") / "model.safetensors", "np") as stored:
        names = set(stored.keys())
    layer = "model.transformer.blocks.0."
    assert {layer + "self_attn.att_proj.weight", layer + "mlp.ff_proj.weight",
            layer + "attn_norm.weight", "model.transformer.wte.embedding",
            "model.transformer.wte.new_embedding", "model.transformer.ln_f.weight",
            "lm_head.weight"} <= names
    assert any(name.startswith("model.vision_backbone.") for name in names)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Chunks of 1, 2, 3, 16 and 40 tokens (decode steps among them), the last before the
    split padded: every call's logits are transformers' at that token."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("molmo2"), bundle("molmo2", flavor))


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        flavor, hf_model, bundle):
    """One call of three rows (a 9-token chunk, a decode token, 4 tokens)."""
    hf_dir = hf_model("molmo2")
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(bundle("molmo2", flavor), threads=2, background=False, kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


def with_extra_tokens(length: int) -> list[int]:
    """A prompt holding ids of the extra vocabulary's rows (image markers on the Hub)."""
    ids = prompt_ids(length)
    ids[3::5] = [VOCAB + i % 8 for i in range(len(ids[3::5]))]
    return ids


def test_the_extra_vocabularys_rows_embed_as_transformers_embeds_them(hf_model, bundle):
    hf_dir = hf_model("molmo2")
    ids = with_extra_tokens(24)
    with Engine.load(bundle("molmo2"), threads=2, background=False) as engine:
        got = run_padded(engine.backend, ids, 16, split=20)
    expected = reference_logits(hf_dir, ids)
    for position, logits in got.items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4,
                                   err_msg=f"position {position}")


def with_image_markers(hf_dir, out, count: int):
    """A copy of the checkpoint whose tokenizer adds `count` tokens after the vocabulary
    (ids vocab_size on, as the Hub's image markers)."""
    from tokenizers import AddedToken, Tokenizer

    shutil.copytree(hf_dir, out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(f"<im_{i}>", special=True) for i in range(count)])
    tokenizer.save(str(out / "tokenizer.json"))
    return out


def test_a_tokenizer_with_the_extra_rows_tokens_exports_and_one_beyond_is_refused(
        hf_model, tmp_path):
    """The extra rows' ids are tokens a prompt may hold (8 in the fixture): a text naming
    one runs with transformers' next token; a ninth has no row and is refused, as a plain
    model's tokenizer past vocab_size is."""
    fits = with_image_markers(hf_model("molmo2"), tmp_path / "fits", 8)
    export(fits, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                               show_progress=False))
    with Engine.load(tmp_path / "b", threads=2) as engine:
        ids = engine.tokenizer.encode("a <im_3> b <im_7>")
        assert {VOCAB + 3, VOCAB + 7} <= set(ids)
        expected = int(np.argmax(reference_logits(fits, ids)[-1]))
        got = engine.generate(ids, GenerationParams(max_new_tokens=1, ignore_eos=True))
        assert got.result().token_ids == [expected]
    beyond = with_image_markers(hf_model("molmo2"), tmp_path / "beyond", 9)
    with pytest.raises(ExportError, match="ids up to 136"):
        export(beyond, tmp_path / "c", ExportOptions(chunks=(16,), max_context=64,
                                                     show_progress=False))


def test_olmo_norms_post_norm_layers_and_biases_equal_transformers(tmp_path):
    """qk_norm_type "olmo" (one RMSNorm over all heads' q, one over k), norm_after (each
    sublayer's output normed before its residual add) and q/k/v biases: OLMo's layout of
    the layers (the only proof of that path, so in the default suite)."""
    hf_dir = build_hf_model("molmo2", tmp_path / "hf", qk_norm_type="olmo", norm_after=True,
                            attention_bias=True)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    assert_padded_chunks_match(hf_dir, tmp_path / "b", chunks=(3, 16))


def test_int4_equals_transformers_with_dequantized_weights(hf_model, tmp_path):
    """int4 at float compute: every projection (the fused q/k/v and up/gate as
    transformers splits them, o, down, the LM head) and the joined table as the bundle
    stores them (blocks of one row each: a split by rows quantizes alike)."""
    check_int4_logits(hf_model("molmo2"), tmp_path, with_extra_tokens(20))


def test_int8_decode_steps_equal_transformers_with_int8_projections(hf_model, tmp_path):
    """int8: every projection on per-channel int8 weights with its input quantized on the
    fly, and the joined table as the bundle stores it, one token per call (as decode).
    (Text tokens: with the extra rows' ids too, one input rounding in 20 positions flips,
    6e-3 of logits 0.45 wide; the int4 test above reads those rows.)"""
    hf_dir = hf_model("molmo2")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    check_int8_decode_steps(hf_dir, tmp_path / "b", prompt_ids(20))


_TABLES = molmo2.MOLMO2.joined[0]
# Each piece of the family taken out of the export: its logits must then leave
# transformers' (the comparisons above fail without it).
BROKEN = {
    "[up | gate] order": {"up_first": False},
    "per-layer rope scaling": {"rope_scaling_layers_key": None},
    "the tables' order": {"joined": ((_TABLES[0], _TABLES[1][::-1]),)},
}


@pytest.mark.parametrize("piece", BROKEN)
def test_each_piece_matters(piece, hf_model, tmp_path, monkeypatch):
    hf_dir = hf_model("molmo2")
    monkeypatch.setitem(families.FAMILIES, "molmo2", replace(molmo2.MOLMO2, **BROKEN[piece]))
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    ids = with_extra_tokens(24)
    assert np.abs(logits_at(tmp_path / "b", ids) - reference_logits(hf_dir, ids)[-1]
                  ).max() > 1e-2


@pytest.mark.parametrize("piece", ["qk_norm_type", "norm_after"])
def test_the_olmo_variants_pieces_matter(piece, tmp_path, monkeypatch):
    """Read without qk_norm_type, "olmo"'s norms over the projection are refused at export
    (their weights are not one head wide); read without norm_after, the post-norm layers
    compute pre-norm ones."""
    hf_dir = build_hf_model("molmo2", tmp_path / "hf", qk_norm_type="olmo", norm_after=True)
    broken = {"qk_norm_type": {"qk_norm_from_config": None},
              "norm_after": {"block_from_config": None}}[piece]
    monkeypatch.setitem(families.FAMILIES, "molmo2", replace(molmo2.MOLMO2, **broken))
    try:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                     show_progress=False))
    except ExportError as err:  # per-head norms of the projection's [H * D] weights
        assert piece == "qk_norm_type" and "the q/k norm over 16 values" in str(err)
        return
    ids = prompt_ids(24)
    got = logits_at(tmp_path / "b", ids)
    assert piece == "norm_after"
    assert np.abs(got - reference_logits(hf_dir, ids)[-1]).max() > 1e-2


@pytest.mark.parametrize("keys, message", [
    ({"qk_norm_type": "gemma"}, "qk_norm_type 'gemma' is not supported"),
    ({"use_qk_norm": False}, "use_qk_norm=false"),
    ({"rope_scaling_layers": "all"}, "rope_scaling_layers must be a list of layer indices"),
])
def test_what_molmo2_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "molmo2", "text_config": {**MINIMAL, **keys}})
    assert "\n" not in str(refused.value)


def test_tables_of_other_widths_are_not_joined_in_silence():
    from edgeprefill.export.joined_tensors import Joined

    shapes = {"a": (6, 4), "b": (2, 5)}
    joined = Joined([("t", ("a", "b"))], shapes.__contains__)
    with pytest.raises(ExportError, match=r"t joins tensors of other widths: a \(6, 4\)"):
        joined.shape("t", shapes.__getitem__)
    assert joined.shape("t", {"a": (6, 4), "b": (2, 4)}.__getitem__) == (8, 4)


def test_the_engine_takes_the_extra_vocabularys_ids_from_a_client(hf_model, bundle, tmp_path):
    """The manifest records the extra rows (inspect says so); a prompt of ids holding
    theirs (image markers on the Hub) runs through the engine as through the backend, its
    first token transformers' argmax; an id past the rows, or a negative count in an
    edited manifest, is refused in one line."""
    from click.testing import CliRunner

    from edgeprefill.bundle import load_manifest
    from edgeprefill.cli.main import cli as edgeprefill
    from tests.test_embed import assert_edits_refused

    assert load_manifest(bundle("molmo2")).model.input_vocab_size == VOCAB + 8
    # a model without extra rows writes the manifest it always did
    assert "embed_extra_rows" not in (bundle("llama") / "edgeprefill.json").read_text()
    assert load_manifest(bundle("llama")).model.input_vocab_size == VOCAB
    out = CliRunner().invoke(edgeprefill, ["inspect", str(bundle("molmo2"))]).output
    assert f"vocab {VOCAB} (+8 ids a prompt may hold, never predicted)" in out
    assert_edits_refused(bundle("molmo2"), tmp_path, [
        (lambda raw: raw["model"].update(embed_extra_rows=-1), "embed_extra_rows must be >= 0")])
    ids = with_extra_tokens(24)
    expected = int(np.argmax(reference_logits(hf_model("molmo2"), ids)[-1]))
    with Engine.load(bundle("molmo2"), threads=2) as engine:
        params = GenerationParams(max_new_tokens=1, ignore_eos=True)
        assert engine.generate(ids, params).result().token_ids == [expected]
        beyond = rf"out of range \[0, {VOCAB + 8}\): \[{VOCAB + 8}\]"
        with pytest.raises(RequestError, match=beyond):
            engine.generate([*ids, VOCAB + 8], params)
