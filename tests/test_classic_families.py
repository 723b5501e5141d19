"""OPT, GPT-J, CodeGen, GPT-Neo, Falcon (Falcon-RW's ALiBi: tests/test_alibi.py),
Persimmon, XGLM and BioGPT (export/families/classic.py): their config keys and switches as
transformers reads them, the Hub's OPT layout, and rows of different lengths batched;
InternLM3's and ModernBERT decoder's config keys.
Every chunk's logits and greedy output of the fixtures are checked in
tests/test_exactness.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export import alibi
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model
from tests.test_exactness import FLAVORS, NEW_TOKENS, check_together, prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

SMALL = {"vocab_size": 128, "max_position_embeddings": 128}
CASES = {
    "opt": [{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "ffn_dim": 80},
            {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
             "ffn_dim": 96, "do_layer_norm_before": False, "word_embed_proj_dim": 32,
             "enable_bias": False, "activation_function": "gelu"}],
    "gptj": [{"n_embd": 64, "n_layer": 2, "n_head": 2, "rotary_dim": 16},
             # the reader's names win where both are given (attribute_map)
             {"n_embd": 32, "hidden_size": 64, "n_layer": 2, "num_hidden_layers": 3,
              "n_head": 8, "num_attention_heads": 4, "rotary_dim": 8, "n_inner": 80,
              "layer_norm_epsilon": 1e-3}],
    "codegen": [{"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 16,
                 "activation_function": "gelu"}],
    "gpt_neo": [{"hidden_size": 64, "num_layers": 3, "num_heads": 4, "window_size": 5,
                 "attention_types": [[["local"], 1], [["global", "local"], 1]]},
                {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "intermediate_size": 80, "attention_types": [[["global"], 2]]}],
    "falcon": [{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
               {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "new_decoder_architecture": True, "num_kv_heads": 2, "ffn_hidden_size": 80,
                "bias": True, "activation": "gelu_pytorch_tanh"},
               {"n_embed": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
                "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1},
               {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "multi_query": False, "parallel_attn": False, "layer_norm_epsilon": 1e-3},
               # Falcon-RW's: ALiBi in place of rotary
               {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "multi_query": False, "parallel_attn": False, "bias": True, "alibi": True}],
    "xglm": [{"d_model": 64, "num_layers": 2, "attention_heads": 4, "ffn_dim": 80},
             {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
              "scale_embedding": False, "activation_function": "relu"}],
    "biogpt": [{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 80, "layer_norm_eps": 1e-3},
               {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "scale_embedding": False, "hidden_act": "gelu_new"}],
}
# keys other families read, which these models ignore
FOREIGN = {"num_key_value_heads": 1, "head_dim": 8, "rope_theta": 5.0, "sliding_window": 3,
           "partial_rotary_factor": 0.25, "no_rope_layer_interval": 2}


def hf_model_of(family: str, keys: dict):
    config = transformers.AutoConfig.for_model(family, pad_token_id=0, **SMALL, **keys)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def ffn_width(layer) -> int:
    mlp = getattr(layer, "mlp", layer)  # OPT's layer holds fc1 itself
    fc = next(getattr(mlp, name) for name in ("fc1", "fc_in", "c_fc", "dense_h_to_4h")
              if hasattr(mlp, name))
    return fc.weight.shape[0]


@pytest.mark.parametrize(("family", "keys"), [
    pytest.param(family, {**keys, **foreign}, id=f"{family}-{i}{'-foreign' if foreign else ''}")
    for family, cases in CASES.items() for i, keys in enumerate(cases)
    for foreign in ({}, {k: v for k, v in FOREIGN.items()  # FalconConfig fails on head_dim
                         if (family, k) != ("falcon", "head_dim")})])
def test_config_keys_read_as_the_model_builds_them(family, keys):
    ours = ModelConfig.from_hf({"model_type": family, **SMALL, **keys})
    model = hf_model_of(family, keys)
    config, decoder = model.config, model.get_decoder()
    layers = getattr(decoder, "layers", None) or decoder.h
    first = layers[0]
    attn = getattr(first, "self_attn", None) or getattr(first, "self_attention", None) or \
        first.attn
    attn = getattr(attn, "attention", attn)  # GPT-Neo's module inside its module
    kv_heads = getattr(attn, "num_kv_heads", config.num_attention_heads)
    if getattr(attn, "new_decoder_architecture", False):  # Falcon's attention says heads
        kv_heads = config.num_kv_heads
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.num_kv_heads) == (
        config.hidden_size, len(layers), config.num_attention_heads, kv_heads)
    assert ours.intermediate_size == ffn_width(first)
    embed_scale = getattr(decoder, "embed_scale", None) or getattr(
        decoder.get_input_embeddings(), "embed_scale", 1.0)  # XGLM's, BioGPT's
    assert (ours.embed_scale or 1.0) == pytest.approx(embed_scale)
    norm = next(getattr(first, name) for name in ("self_attn_layer_norm", "ln_1",
                                                  "input_layernorm", "ln_attn")
                if hasattr(first, name))
    assert ours.norm_eps == norm.eps
    # GPT-Neo: none; Falcon's attention divides by sqrt(head_dim)
    assert ours.attn_scale == pytest.approx(getattr(attn, "scaling", None) or getattr(
        attn, "inv_norm_factor", 1.0))
    assert ours.tie_embeddings is config.tie_word_embeddings
    assert ours.final_norm is (getattr(decoder, "final_layer_norm", True) is not None)
    projected = getattr(decoder, "project_in", None)
    assert ours.embed_width == (projected.in_features if projected is not None else None)
    qkv = next(getattr(attn, name) for name in ("k_proj", "qkv_proj", "query_key_value")
               if hasattr(attn, name))  # CodeGen's and Falcon's are fused
    out = getattr(attn, "out_proj", None) or attn.dense
    assert (ours.qkv_bias, ours.o_bias) == (qkv.bias is not None, out.bias is not None)
    x = torch.linspace(-4, 4, 101)
    act = getattr(first, "activation_fn", None) or first.mlp.act
    ours_act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
                "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    torch.testing.assert_close(ours_act[ours.activation](x), act(x))
    if family in ("gptj", "codegen"):
        assert ours.rotary_dim == decoder.rotary_emb.pos_embd_dim
        assert ours.ropes[GLOBAL].theta == 10000.0
        assert [layer.window for layer in ours.layers] == [None] * len(layers)
    elif family == "falcon" and config.alibi:
        assert [layer.rope for layer in ours.layers] == [None] * len(layers)
        assert ours.alibi == alibi.slopes(config.num_attention_heads)
        assert ours.alibi_bfloat16_scale == pytest.approx(attn.inv_norm_factor)
    elif family == "falcon":
        assert ours.alibi is None
        assert (ours.rotary_dim, ours.ropes[GLOBAL].theta) == (
            ours.head_dim, config.rope_parameters["rope_theta"])
        assert [layer.window for layer in ours.layers] == [None] * len(layers)
        parallel = hasattr(first, "ln_mlp")
        assert ours.block == ("parallel" if parallel else "shared" if config.parallel_attn
                              else "pre")
    else:
        assert [layer.rope for layer in ours.layers] == [None] * len(layers)
        windows = [getattr(layer.attn, "attention_type", None) == "local" and config.window_size
                   or None for layer in layers] if family == "gpt_neo" else [None] * len(layers)
        assert [layer.window for layer in ours.layers] == windows


@pytest.mark.parametrize(("keys", "message"), [
    ({"model_type": "opt", "layer_norm_elementwise_affine": False},
     "opt: layer_norm_elementwise_affine=false (LayerNorms without weights) is not supported"),
    ({"model_type": "gptj", "rotary_dim": None},
     "gptj: rotary_dim null (a rotary table as wide as hidden_size) is not supported"),
    ({"model_type": "gptj", "rotary_dim": 64}, "gptj: rotary_dim 64 exceeds the head size 16"),
    ({"model_type": "codegen", "hidden_size": 66, "num_attention_heads": 2, "rotary_dim": 8},
     "codegen: n_embd 66 is not a multiple of the 4 shards of its fused q/k/v projection"),
    ({"model_type": "falcon", "new_decoder_architecture": True, "parallel_attn": False},
     "falcon: new_decoder_architecture with parallel_attn=false (its model fails) is not"),
    ({"model_type": "falcon", "multi_query": False, "num_kv_heads": 2},
     "falcon: num_kv_heads other than num_attention_heads without multi_query"),
    ({"model_type": "gpt_neo", "attention_types": [[["global", "local"], 12]]},
     "attention_types lists 24 layers; num_layers is 4"),
    ({"model_type": "gpt_neo", "attention_types": [[["global", "sparse"], 2]]},
     "attention_types holds ['sparse']; GPT-Neo's layers are global or local"),
])
def test_what_export_cannot_compute_is_refused_in_one_line(keys, message):
    base = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "n_embd": 64, "n_layer": 4, "n_head": 4, "vocab_size": 128}
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({**base, **keys})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("family", "keys"), [
    ("opt", {"enable_bias": False}),
    ("opt", {"_remove_final_layer_norm": True}),
    ("opt", {"do_layer_norm_before": False}),  # post-norm layers, the embedding as wide
    ("opt", {"word_embed_proj_dim": 32}),  # pre-norm layers, a projected embedding
    ("opt", {"tie_word_embeddings": False}),
    ("gpt_neo", {"attention_types": [[["local"], 2]], "window_size": 1}),  # itself only
    ("persimmon", {"qk_layernorm": False}),
    ("xglm", {"scale_embedding": False}),
    ("xglm", {"pad_token_id": 5}),  # position 3's sinusoids are zeros
    ("biogpt", {"scale_embedding": False}),
    ("persimmon", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                       "partial_rotary_factor": 1.0}}),
])
def test_the_switches_export_as_transformers_computes_them(tmp_path, family, keys):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model(family, tmp_path / "hf", **keys)
    saved = json.loads((hf_dir / "config.json").read_text())
    assert all(saved[key] == value for key, value in keys.items())  # as config.json holds it
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)[-1]
    for flavor in FLAVORS:
        export(hf_dir, tmp_path / flavor, ExportOptions(flavor=flavor, chunks=(16,),
                                                        max_context=128, show_progress=False))
        np.testing.assert_allclose(last_logits(tmp_path / flavor, ids), expected, rtol=1e-4,
                                   atol=1e-4, err_msg=flavor)


def test_a_hub_opt_checkpoint_without_the_model_prefix_exports(tmp_path):
    """facebook/opt-125m and its fine-tunes store OPTModel's tensors (decoder.layers.0...,
    no `model.`, no lm_head: the head is the tied embedding)."""
    hf_dir = build_hf_model("opt", tmp_path / "hf")
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)[-1]
    path = hf_dir / "model.safetensors"
    tensors = {name.removeprefix("model."): array for name, array in load_file(path).items()
               if name != "lm_head.weight"}
    assert "decoder.embed_positions.weight" in tensors
    save_file(tensors, path, metadata={"format": "pt"})
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               expected, rtol=1e-4, atol=1e-4)


CLASSIC = ("opt", "opt-350m", "gptj", "codegen", "gpt_neo", "falcon", "falcon-7b",
           "falcon-sequential", "persimmon", "xglm", "biogpt", "internlm3",
           "modernbert-decoder")


@pytest.mark.parametrize(("family", "flavor"), [
    pytest.param(family, flavor, marks=() if (family, flavor) in (
        ("gpt_neo", "ort"), ("opt-350m", "standard"), ("falcon", "ort"),
        ("modernbert-decoder", "standard")) else pytest.mark.slow)
    for family in CLASSIC for flavor in FLAVORS])
def test_rows_of_different_lengths_generate_together_as_transformers(
    family, flavor, hf_model, bundle
):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_together(engine, hf_model(family), NEW_TOKENS)
    engine.close()


@pytest.mark.parametrize("keys", [
    {},
    {"head_dim": None},  # hidden / heads, as InternLM3Config fills it in
    # the Hub's names win over the config class's where both are given (attribute_map)
    {"qkv_bias": False, "bias": False, "attention_bias": True, "mlp_bias": True},
])
def test_internlm3_config_reads_as_its_config_class(keys):
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 128}
    ours = ModelConfig.from_hf({"model_type": "internlm3", **base, **keys})
    hf = transformers.AutoConfig.for_model("internlm3", **base, **keys)
    assert (ours.head_dim, ours.num_kv_heads, ours.qkv_bias, ours.o_bias, ours.mlp_bias) == (
        hf.head_dim, hf.num_key_value_heads, hf.attention_bias, hf.attention_bias, hf.mlp_bias)
    assert (ours.norm_eps, ours.max_positions) == (hf.rms_norm_eps, hf.max_position_embeddings)


@pytest.mark.parametrize(("keys", "message"), [
    ({"qkv_bias": True, "bias": True}, "internlm3: bias=true (biases on the gated MLP) is not"),
    ({"qkv_bias": True}, "internlm3: qkv_bias (attention_bias) and bias (mlp_bias) must be"),
])
def test_internlm3_biases_are_refused_in_one_line(keys, message):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({"model_type": "internlm3", "hidden_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 4,
                             "vocab_size": 128, **keys})
    assert message in str(err.value) and "\n" not in str(err.value)


MODERNBERT = {"model_type": "modernbert-decoder", "hidden_size": 64, "num_hidden_layers": 4,
              "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 128}


@pytest.mark.parametrize("keys", [
    {},
    {"global_attn_every_n_layers": 2, "local_attention": 16, "global_rope_theta": 5e5,
     "local_rope_theta": 500.0},
    {"sliding_window": 5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"layer_types": ["full_attention", "full_attention", "sliding_attention",
                     "full_attention"], "rope_theta": 7.0},  # a theta its class ignores
])
def test_modernbert_decoder_layers_and_ropes_read_as_its_config_class(keys):
    from edgeprefill.export.layer_attention import LOCAL

    ours = ModelConfig.from_hf({**MODERNBERT, **keys})
    hf = transformers.AutoConfig.for_model(**{**MODERNBERT, **keys})
    assert [layer.window for layer in ours.layers] == [
        hf.sliding_window if kind == "sliding_attention" else None for kind in hf.layer_types]
    for name, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        params = hf.rope_parameters[kind]
        assert (ours.ropes[name].theta, ours.ropes[name].kind, ours.ropes[name].factor) == (
            params["rope_theta"], params["rope_type"], params.get("factor", 1.0))
    assert ours.head_activation == "gelu" and ours.embed_scale is None


@pytest.mark.parametrize(("keys", "message"), [
    ({"norm_bias": True}, "norm_bias=true (LayerNorms with bias) is not supported"),
    ({"mlp_bias": True}, "mlp_bias=true (biases on the gated MLP) is not supported"),
    ({"classifier_bias": True}, "classifier_bias=true (a bias on the prediction head's"),
    ({"decoder_bias": False}, "decoder_bias=false (an LM head without bias) is not supported"),
    ({"local_attention": None}, "sliding layers without a window (sliding_window null, or"),
    ({"sliding_window": None}, "sliding layers without a window (sliding_window null, or"),
])
def test_modernbert_decoder_switches_it_cannot_compute_are_refused_in_one_line(keys, message):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({**MODERNBERT, **keys})
    assert f"modernbert-decoder: {message}" in str(err.value) and "\n" not in str(err.value)


def test_a_refused_type_is_refused_in_one_line_by_the_cli(tmp_path):
    """(DiffLlama, JetMoE, then Inkling were this test's type until they were exported.)"""
    from tests.test_cli_errors import cli

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "hrm_text"}))
    result = cli("export", tmp_path, "-o", tmp_path / "out")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model_type 'hrm_text': HRM-Text's recurrence over depth" \
        in lines[0], lines


def test_an_opt_position_table_that_disagrees_with_its_config_is_refused(tmp_path):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model("opt", tmp_path / "hf")  # a table of 1024 + 2 rows
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=32,
                                                     show_progress=False))
    assert str(err.value) == (
        "model.decoder.embed_positions.weight has shape (1026, 64), but config.json implies "
        "(66, 64) (max_position_embeddings 64 + offset 2, hidden 64)")
