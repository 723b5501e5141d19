"""Multi-head latent attention (export/latent_attention.py): MiniCPM3 and Youtu-LLM cache
one KV head of [rotated k_pe | normed latent] per token and fold kv_b_proj into the query
and the output. Their fixtures' chunk logits against transformers, in both flavours, run
in test_exactness (and their greedy text over every chunking under slow); here: the
configs as transformers builds the attention, the cache's shape, the native kernels,
rows of different lengths at once, and quantized bundles."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import transformers

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.engines.base import kv_slot_bytes
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.state_models import run_padded, variant_bundles
from tests.test_exactness import check_together, prompt_ids, reference_logits
from tests.test_families import last_logits
from tests.test_moe import hf_moe_model_shapes
from tests.test_quantize import dequantize_embeddings

MLA_FAMILIES = ("minicpm3", "youtu", "deepseek_v2", "deepseek_v3", "glm4_moe_lite",
                "sarvam_mla", "axk1")
# MLA with DeepSeek-V3's experts (noaux_tc); deepseek_v3's is the default suite's
DEEPSEEK_V3_FAMILIES = ("deepseek_v3", "glm4_moe_lite", "sarvam_mla", "axk1")
# Shaped as openbmb/MiniCPM3-4B's config.json: a longrope over the 32 rope dims.
MINICPM3_4B = {
    "model_type": "minicpm3", "hidden_size": 2560, "intermediate_size": 6400,
    "num_hidden_layers": 62, "num_attention_heads": 40, "num_key_value_heads": 40,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "q_lora_rank": 768, "kv_lora_rank": 256,
    "rms_norm_eps": 1e-5, "vocab_size": 73448, "scale_emb": 12, "dim_model_base": 256,
    "scale_depth": 1.4, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 32768,
                     "long_factor": [1.0 + i / 4 for i in range(16)],
                     "short_factor": [1.0 + i / 8 for i in range(16)]},
}
# YoutuConfig's defaults (Youtu-LLM-2B's shape) under DeepSeek-V2-Lite's yarn rope, whose
# mscale_all_dim scales the softmax by mscale^2.
YOUTU_YARN = {
    "model_type": "youtu",
    "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096,
                     "rope_theta": 10000},
}

# Shaped as deepseek-ai/DeepSeek-V2-Lite's config.json (its keys transformers ignores left
# out): a dense query, greedy routing over 64 experts after one dense layer.
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "greedy", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "norm_topk_prob": False, "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "vocab_size": 102400, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "bos_token_id": 100000, "eos_token_id": 100001,
}


# DeepseekV3Config's defaults (DeepSeek-V3's and R1's shape) under the Hub's yarn rope
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
# Shaped as moonshotai/Moonlight-16B-A3B's config.json: a dense query, one group of 64
# experts, no yarn
MOONLIGHT_16B_A3B = {
    "model_type": "deepseek_v3", "vocab_size": 163840, "hidden_size": 2048,
    "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
    "n_routed_experts": 64, "routed_scaling_factor": 2.446, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
    "rope_scaling": None,
}
# Shaped as moonshotai/Kimi-K2-Instruct's config.json: 384 experts in one group, 64 heads,
# a yarn rope of factor 32 (its own model_type, "kimi_k2", is remote code's: transformers
# reads the config as deepseek_v3 only inside Kimi-K2.5's text_config)
KIMI_K2 = {
    "model_type": "deepseek_v3", "vocab_size": 163840, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 384, "routed_scaling_factor": 2.827, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
    "num_nextn_predict_layers": 0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
# Glm4MoeLiteConfig's defaults (GLM-4.7-Flash's shape)
GLM_47_FLASH = {"model_type": "glm4_moe_lite", "rope_theta": 1000000.0}
# sarvam-105b as its remote code's config.json names things: num_experts,
# num_shared_experts, a head_dim of the cached width, a "deepseek_yarn" rope
SARVAM_105B = {
    "model_type": "sarvam_mla", "num_experts": 128, "num_shared_experts": 1,
    "head_dim": 576, "q_head_dim": 192, "num_experts_per_tok": 8,
    "rope_scaling": {"type": "deepseek_yarn", "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 4096, "rope_theta": 10000},
}
DEEPSEEK_V3_HUB = (DEEPSEEK_V3, MOONLIGHT_16B_A3B, KIMI_K2, GLM_47_FLASH, SARVAM_105B)
DEEPSEEK_V3_IDS = ("deepseek_v3", "moonlight", "kimi_k2", "glm4_moe_lite", "sarvam_mla")


@pytest.mark.parametrize("raw", (MINICPM3_4B, YOUTU_YARN, DEEPSEEK_V2_LITE, *DEEPSEEK_V3_HUB),
                         ids=("minicpm3", "youtu", "deepseek_v2", *DEEPSEEK_V3_IDS))
def test_a_hub_config_reads_as_transformers_builds_its_attention(raw):
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    attn = model.layers[0].self_attn
    rotary = type(model.rotary_emb)(config)  # on the CPU: its inv_freq computed
    rope = ours.ropes[GLOBAL]
    np.testing.assert_allclose(rope.inv_freq(), rotary.inv_freq.numpy(), rtol=1e-6)
    assert rope.cos_sin_scale() == pytest.approx(rotary.attention_scaling, rel=1e-6)
    assert ours.latent is not None
    assert (ours.latent.q_lora_rank, ours.latent.kv_lora_rank, ours.latent.nope_dim,
            ours.latent.rope_dim, ours.latent.v_dim) == (
        attn.q_lora_rank, attn.kv_lora_rank, attn.qk_nope_head_dim, attn.qk_rope_head_dim,
        attn.v_head_dim)
    assert ours.attn_scale == pytest.approx(attn.scaling, rel=1e-12)
    assert (ours.num_kv_heads, ours.head_dim, ours.rotary_dim) == (
        1, attn.qk_rope_head_dim + attn.kv_lora_rank, attn.qk_rope_head_dim)
    assert ours.ropes[GLOBAL].kind == config.rope_parameters["rope_type"]


def test_minicpm3s_scales_read_as_its_config_class():
    ours = ModelConfig.from_hf(MINICPM3_4B)
    hf = transformers.MiniCPM3Config(**{k: v for k, v in MINICPM3_4B.items()
                                        if k != "model_type"})
    assert ours.embed_scale == hf.scale_emb
    assert ours.residual_scale == pytest.approx(hf.scale_depth / hf.num_hidden_layers**0.5)
    assert ours.logits_divisor == pytest.approx(hf.logits_scaling)
    assert ours.latent is not None and ours.latent.v_dim == hf.v_head_dim == 64


@pytest.mark.parametrize("family", MLA_FAMILIES)
def test_the_cache_holds_one_head_of_rope_and_latent_per_token(family, bundle):
    """MiniCPM3's fixture: 4 heads whose decompressed K and V would be 4 x (32 + 24) floats
    a token and layer; the bundle keeps 16 + 32, one buffer as its key and value cache
    (graph.value_is_key, tests/test_mla_one_cache.py)."""
    path = bundle(family)
    model = json.loads((path / MANIFEST_FILE).read_text())["model"]
    assert (model["num_kv_heads"], model["head_dim"]) == (1, 16 + 32)
    # each layer's one cache, float32: what `inspect` and the KV budget count
    manifest = load_manifest(path)
    assert manifest.graph.value_is_key == list(range(model["num_layers"]))
    assert kv_slot_bytes(manifest.model, 128, np.float32, 0, manifest.graph.value_is_key) \
        == model["num_layers"] * 48 * 4 * 128


@pytest.mark.parametrize("flavor", ("ort", "standard"))
@pytest.mark.parametrize("family", ("minicpm3", *(pytest.param(f, marks=pytest.mark.slow)
                                                  for f in MLA_FAMILIES[1:])))
def test_rows_of_different_lengths_generate_transformers_greedy_text(family, flavor,
                                                                      hf_model, bundle):
    """Three prompts at once (their chunks and decode rows in shared calls where the graph
    packs tokens): each reply is transformers' greedy text of its prompt."""
    with Engine.load(bundle(family, flavor), threads=2) as engine:
        check_together(engine, hf_model(family), 8)


@pytest.mark.parametrize("family", (*MLA_FAMILIES[:4], *(
    pytest.param(f, marks=pytest.mark.slow) for f in DEEPSEEK_V3_FAMILIES[1:])))
def test_the_native_kernels_take_the_latent_attention(family, library, monkeypatch,
                                                       hf_model, bundle):
    """With EDGEPREFILL_KERNELS=require the ort bundle's MQA of 48-wide heads runs in
    PrefillAttention/DecodeAttention (rotary outside, do_rotary=0): padded chunks and
    rows of different lengths as transformers computes them."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    hf_dir = hf_model(family)
    ids = prompt_ids(30)
    expected = reference_logits(hf_dir, ids)
    with Engine.load(bundle(family), threads=2, background=False) as engine:
        assert engine.backend.kernels.described.startswith("native (PrefillAttention")
        for position, logits in run_padded(engine.backend, ids, 16, split=30).items():
            np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)
    with Engine.load(bundle(family), threads=2) as engine:
        check_together(engine, hf_dir, 8)


def test_a_youtu_config_rotating_halves_is_refused_in_one_line():
    with pytest.raises(ExportError, match=r"^youtu: rope_interleave=false \(rotary on "
                                          r"halves\) is not supported$"):
        ModelConfig.from_hf({"model_type": "youtu", "rope_interleave": False})


def test_a_kv_b_proj_of_another_shape_is_refused_in_one_line(hf_model, tmp_path):
    hf_dir = hf_model("minicpm3")
    raw = json.loads((hf_dir / "config.json").read_text())
    (tmp_path / "hf").mkdir()
    for f in hf_dir.iterdir():
        (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**raw, "v_head_dim": 16}))
    with pytest.raises(ExportError, match=r"kv_b_proj.weight has shape \(160, 32\), but "
                                          r"config.json implies \(128, 32\)"):
        export(tmp_path / "hf", tmp_path / "b", ExportOptions(show_progress=False))


def dequantized_int4_but_kv_b(model, block: int = 32, keep: tuple[str, ...] = ()) -> None:
    """The projections an int4 bundle quantizes (DeepSeek-V2's experts included), as it
    stores them; kv_b_proj, which the bundle folds into W_UK and W_UV, the router and any
    parameter whose name holds a part of `keep` stay float there and here."""
    with torch.no_grad():
        dequantize_embeddings(model, "int4", block)
        for name, param in model.named_parameters():
            if param.dim() != 2 and "experts" not in name or "embed" in name or \
                    "kv_b_proj" in name or name.endswith("mlp.gate.weight") or \
                    any(part in name for part in keep):
                continue
            flat = param.reshape(-1, param.shape[-1]).numpy()
            param.copy_(torch.from_numpy(int4_dequantize(
                *int4_blockwise(flat, block), flat.shape[1])).reshape(param.shape))


@pytest.mark.slow
@pytest.mark.parametrize("family", MLA_FAMILIES)
def test_int4_equals_transformers_with_the_dequantized_projections(family, hf_model,
                                                                   tmp_path):
    check_int4_dequantized_but_kv_b(hf_model(family), tmp_path)


def check_int4_dequantized_but_kv_b(hf_dir, tmp_path) -> None:
    """The int4 bundle of `hf_dir` computes what transformers does with every projection
    dequantized but kv_b_proj and the routers (dequantized_int4_but_kv_b); a gated delta
    rule, where the model has one, in its recurrent form as the bundle runs it."""
    from tests.test_exactness import recurrent_delta_rule

    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf_dir)
    dequantized_int4_but_kv_b(model)
    ids = prompt_ids(20)
    with torch.no_grad(), recurrent_delta_rule():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids), expected, rtol=1e-3,
                               atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("kind, bound", (("int8", 0.05), ("int4", 0.35)))
def test_quantized_bundles_stay_within_the_usual_drift(kind, bound, hf_model, bundle,
                                                       tmp_path):
    """MiniCPM3's default int8 and int4 bundles against the fp32 one (measured 0.041 and
    0.30 of the largest logit; the llama fixture's: int8 0.036, int4 0.30, docs/design.md).
    Youtu's fixture is no yardstick: transformers itself, on the int4-rounded weights,
    moves its logits by 1.08 (int8 bundle 0.075), and the bundle computes that model
    (the test above)."""
    family = "minicpm3"
    hf_dir = hf_model(family)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                 show_progress=False, quant=QuantConfig(kind)))
    ids = prompt_ids(40)
    reference = last_logits(bundle(family), ids)
    drift = np.abs(last_logits(tmp_path / "b", ids) - reference).max() / np.abs(reference).max()
    assert drift < bound


@pytest.fixture(scope="module")
def greedy_deepseek(tmp_path_factory):
    """flavor -> (hf dir, bundle): the deepseek_v2 fixture routed by topk_method greedy."""
    return variant_bundles(tmp_path_factory, "deepseek_v2", "dsv2-greedy",
                           {"topk_method": "greedy", "n_group": None, "topk_group": None})


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_deepseek_v2s_greedy_routing_matches_transformers(flavor, greedy_deepseek,
                                                          hf_model):
    """Greedy routing (softmax top 2 of all 8 experts, times routed_scaling_factor 2.5): in
    the ort flavour ONNX Runtime's MoE op, its output scaled after. The group-limited
    fixture (test_exactness) routes otherwise: its logits differ from these."""
    hf_dir, path = greedy_deepseek(flavor)
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)
    assert np.abs(expected - reference_logits(hf_model("deepseek_v2"), ids)).max() > 0.1
    if flavor == "ort":
        graph = onnx.load(path / "model.onnx", load_external_data=False).graph
        assert sum(node.op_type == "MoE" for node in graph.node) == 2  # layers 1 and 2
    with Engine.load(path, threads=2, background=False) as engine:
        for position, logits in run_padded(engine.backend, ids, 16, split=40).items():
            np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys, message", [
    ({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not supported; supported: "
                                  "greedy, group_limited_greedy"),
    ({"topk_method": "group_limited_greedy"}, "topk_method group_limited_greedy needs "
                                              "n_group and topk_group"),
    ({"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1,
      "n_routed_experts": 8}, "n_group (3) must divide the 8 experts"),
])
def test_a_deepseek_v2_routing_export_does_not_compute_is_refused_in_one_line(keys, message):
    raw = {"model_type": "deepseek_v2", "num_experts_per_tok": 2, **keys}
    with pytest.raises(ExportError, match="^[^\n]*" + message.replace("(", r"\(").replace(
            ")", r"\)")):
        ModelConfig.from_hf(raw)


def test_deepseek_v2_lites_experts_read_as_transformers_builds_them():
    ours = ModelConfig.from_hf(DEEPSEEK_V2_LITE).moe
    config = transformers.AutoConfig.for_model(**DEEPSEEK_V2_LITE)
    with torch.device("meta"):
        layers = transformers.AutoModelForCausalLM.from_config(config).model.layers
    moe_layers = tuple(i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts"))
    assert ours is not None and ours.layers == moe_layers == tuple(range(1, 27))
    block = layers[1].mlp
    assert (ours.experts, ours.top_k, ours.width, ours.scaling, ours.norm_topk) == (
        block.experts.num_experts, block.gate.top_k, block.experts.intermediate_dim,
        block.gate.routed_scaling_factor, False)
    assert ours.shared_width == block.shared_experts.intermediate_size == 2 * 1408
    assert (ours.routing, ours.groups, ours.top_groups) == ("softmax_group_limited", 1, 1)


@pytest.mark.parametrize("raw", DEEPSEEK_V3_HUB, ids=DEEPSEEK_V3_IDS)
def test_a_deepseek_v3_hub_config_reads_its_experts_as_transformers_builds_them(raw):
    moe = ModelConfig.from_hf(raw).moe
    assert moe is not None and moe.routing == "sigmoid"
    assert (moe.experts, moe.top_k, moe.width, list(moe.layers), moe.shared_width,
            moe.scaling, moe.norm_topk, moe.expert_bias, moe.groups,
            moe.top_groups) == hf_moe_model_shapes(raw)


def test_a_deepseek_v3_routing_unlike_transformers_is_refused_in_one_line():
    with pytest.raises(ExportError, match=r"^config.json: scoring_func 'softmax' is not "
                                          r"supported \(the router computes 'sigmoid'\)$"):
        ModelConfig.from_hf({**MOONLIGHT_16B_A3B, "scoring_func": "softmax"})


@pytest.mark.parametrize("raw, message", [
    ({"model_type": "deepseek_v3", "rope_interleave": False},
     r"^deepseek_v3: rope_interleave=false \(rotary on halves\) is not supported$"),
    ({**GLM_47_FLASH, "partial_rotary_factor": 0.5},
     r"^glm4_moe_lite: partial_rotary_factor other than 1 is not supported$"),
    ({"model_type": "deepseek_v32", "partial_rotary_factor": 0.5},
     r"^deepseek_v32: partial_rotary_factor other than 1 is not supported$"),
])
def test_a_deepseek_v3_option_export_does_not_compute_is_refused_in_one_line(raw, message):
    with pytest.raises(ExportError, match=message):
        ModelConfig.from_hf(raw)


@pytest.mark.parametrize("mtp_layers, warned", ((1, False), (0, True)))
def test_deepseek_v3s_multi_token_prediction_layer_is_left_out_quietly(
        mtp_layers, warned, hf_model, tmp_path, caplog):
    """DeepSeek-V3 checkpoints hold num_nextn_predict_layers layers after the last
    (model.layers.61 of V3's 61), a draft model's that transformers ignores at load: export
    leaves them out without a warning. A config that counts none names them."""
    from safetensors.numpy import load_file, save_file

    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("deepseek_v3"), hf_dir)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for part in ("eh_proj.weight", "enorm.weight", "self_attn.kv_b_proj.weight",
                 "mlp.experts.0.up_proj.weight"):
        tensors[f"model.layers.3.{part}"] = np.ones((2, 2), np.float32)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**raw,
                                                    "num_nextn_predict_layers": mtp_layers}))
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    unused = [r.getMessage() for r in caplog.records if "does not use" in r.getMessage()]
    assert bool(unused) == warned
    assert not warned or "4 tensors config.json does not use (model.layers.3." in unused[0]


def test_an_axk1_checkpoint_as_the_hub_stores_it_exports_as_transformers_loads_it(
        hf_model, tmp_path):
    """A.X K1's Hub checkpoints store no e_score_correction_bias (transformers leaves it at
    zero) and post_mlp_layernorm at the layer's level, on the dense layers too (unused;
    transformers renames the expert layers' into mlp at load): the bundle routes without a
    bias and norms the expert layers' output with the layer-level weights."""
    from safetensors.torch import load_file, save_file

    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("axk1"), hf_dir)
    tensors = load_file(hf_dir / "model.safetensors")
    hub = {k.replace("mlp.post_mlp_layernorm", "post_mlp_layernorm"): v
           for k, v in tensors.items() if "e_score_correction_bias" not in k}
    moved = [k for k in hub if k.endswith("post_mlp_layernorm.weight")]
    assert moved, "the fixture has no post_mlp_layernorm to move"
    for k in moved:  # distinct weights, so a norm read from the wrong place shows
        hub[k] = hub[k] + 0.25 * torch.rand_like(hub[k])
    for layer in (0, 2):  # the dense layers' copies, which nothing reads
        hub[f"model.layers.{layer}.post_mlp_layernorm.weight"] = torch.full_like(
            hub[moved[0]], 7.0)
    save_file(hub, hf_dir / "model.safetensors", metadata={"format": "pt"})
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    ids = prompt_ids(20)
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)
