"""Config normalization: rope types as transformers computes them, and one-line refusals."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.families import FAMILIES
from edgeprefill.export.families.image_text import WRAPPERS
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ACTIVATIONS, ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from tests.conftest import IMAGE_TEXT, TIMM_TOWERS, build_hf_model, hf_auto_class
from tests.test_exactness import prompt_ids, reference_logits

BASE = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            max_position_embeddings=4096)
SHORT = [1.0 + 0.1 * i for i in range(16)]
LONG = [1.0 + 0.5 * i for i in range(16)]
ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16},
    "longrope": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                 "original_max_position_embeddings": 1024},
}


def model_rotary(family: str, raw: dict):
    """The rotary embedding module of the family's transformers model built from `raw`."""
    keys = {k: v for k, v in raw.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(family, **{"pad_token_id": 0, **keys})
    return transformers.AutoModelForCausalLM.from_config(config).base_model.rotary_emb


def model_cos(rotary, context: int, family: str = "llama", *layer_type: str) -> np.ndarray:
    """cos [context, rotary_dim / 2] of the model over positions 0..context-1 (a longrope
    model picks its factors from that length, as it does from a sequence's); Gemma 3's
    rotary takes the layer type."""
    with torch.no_grad():
        cos, _ = rotary(torch.zeros(1), torch.arange(context)[None], *layer_type)
    if FAMILIES[family].rope_interleaved:  # each frequency twice in a row (Cohere)
        return cos[0, :, ::2].numpy()
    return cos[0, :, : cos.shape[-1] // 2].numpy()


# Llama's model rotates all of head_dim; StableLM's (as Phi's, Phi-3's, GPT-NeoX's) part.
@pytest.mark.parametrize("family, partial", [("llama", 1.0), ("stablelm", 0.5)])
@pytest.mark.parametrize("name", sorted(ROPES))
def test_rope_tables_equal_the_transformers_models(name, family, partial):
    params = dict(ROPES[name], rope_theta=50000.0, partial_rotary_factor=partial)
    if name == "longrope" and partial < 1:
        params.update(short_factor=SHORT[:8], long_factor=LONG[:8])
    raw = dict(BASE, model_type=family, num_attention_heads=2, num_key_value_heads=2,
               rope_parameters=params)  # head_dim 32
    rotary = model_rotary(family, raw)
    ours = ModelConfig.from_hf(raw)
    for context in (1024, 4096):  # longrope: the short factors, then the long ones
        rope = ours.for_context(context).ropes[GLOBAL]
        freqs = np.outer(np.arange(context, dtype=np.float32), rope.inv_freq())
        np.testing.assert_allclose(np.cos(freqs) * np.float32(rope.cos_sin_scale()),
                                   model_cos(rotary, context), atol=1e-4)


@pytest.mark.parametrize("where", ("rope_parameters", "top level"))
@pytest.mark.parametrize("family", ("llama", "mistral", "qwen2", "gemma", "cohere"))
def test_a_partial_rotary_factor_rotates_all_of_head_dim_where_the_model_ignores_it(
        family, where):
    params = {"rope_type": "default", "rope_theta": 10000.0}
    factor = {"partial_rotary_factor": 0.5}
    raw = dict(BASE, model_type=family, head_dim=32,
               **({"rope_parameters": {**params, **factor}} if where == "rope_parameters"
                  else {"rope_parameters": params, **factor}))
    rope = ModelConfig.from_hf(raw).for_context(1024).ropes[GLOBAL]
    assert rope.rotary_dim == 32
    freqs = np.outer(np.arange(1024, dtype=np.float32), rope.inv_freq())
    np.testing.assert_allclose(np.cos(freqs), model_cos(model_rotary(family, raw), 1024,
                                                          family), atol=1e-4)


def last_logits(bundle_dir, ids: list[int]) -> np.ndarray:
    """The bundle's logits at the last of `ids`, prefilled in one chunk."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine

    engine = Engine.load(bundle_dir, threads=2, background=False)
    logits = engine.backend.run(StepBatch(
        np.array([ids]), np.array([0], np.int32), np.array([len(ids)], np.int32), 0))
    engine.close()
    return logits[0]


def export_small(hf_dir, out, flavor: str = "ort"):
    from edgeprefill.export.exporter import ExportOptions, export

    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(64,), max_context=128,
                                      show_progress=False))
    return out


def saved_alone(family: str, root) -> tuple:
    """The `family` fixture loaded with AutoModelForCausalLM (as fine-tuning scripts load an
    image-text checkpoint) and saved by transformers to root/text with the fixture's
    tokenizer: (that folder, the model's logits at the last of prompt_ids(40))."""
    import shutil

    from transformers import AutoModelForCausalLM

    hf_dir = build_hf_model(family, root / "hf")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.save_pretrained(root / "text")
    shutil.copy(hf_dir / "tokenizer.json", root / "text")
    with torch.no_grad():
        expected = model(torch.tensor([prompt_ids(40)])).logits[0, -1].numpy()
    return root / "text", expected


def test_a_partial_rotary_factor_the_model_ignores_leaves_the_logits_as_transformers(tmp_path):
    hf_dir = build_hf_model("llama", tmp_path / "hf", head_dim=32, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


def test_longrope_beyond_the_original_window_uses_the_long_factors(tmp_path):
    """A bundle whose context exceeds original_max_position_embeddings takes the long
    factors, as transformers does for a sequence longer than that window."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.sdk import Engine

    hf_dir = build_hf_model("phi3", tmp_path / "hf", original_max_position_embeddings=64)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=256,
                                                  show_progress=False))
    ids = prompt_ids(100)  # longer than the original window from its first chunk on
    expected = reference_logits(hf_dir, ids)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    for start in range(0, len(ids), 32):
        part = ids[start:start + 32]
        logits = engine.backend.run(StepBatch(
            np.array([part]), np.array([start], np.int32), np.array([len(part)], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[start + len(part) - 1],
                                   rtol=1e-4, atol=1e-4)
    engine.close()


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "nonesuch"},
     "'nonesuch' is not supported; `edgeprefill export --list-models` lists the supported"),
    # remote-code model types users bring: what they are, and what to take instead
    ({"model_type": "chatglm"}, "GLM-4's -hf releases (model_type glm) are"),
    ({"model_type": "qwen"}, "Qwen1.5 and later (model_type qwen2, qwen3) are"),
    ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "rope type 'mrope'"),
    ({"num_key_value_heads": 3}, "is not a multiple of num_key_value_heads (3)"),
    ({"layer_types": ["full_attention"]}, "layer_types lists 1 layers; there are 2"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "unsupported kinds"),
    ({"hidden_act": "relu6"}, "activation 'relu6' is not supported"),
    ({"model_type": "stablelm", "qk_layernorm": True}, "per-head LayerNorm on q/k"),
    ({"model_type": "cohere", "use_qk_norm": True}, "per-head LayerNorm on q/k"),
    ({"model_type": "ernie4_5", "use_bias": True}, "ernie4_5: use_bias=true"),
    ({"model_type": "arcee", "mlp_bias": True}, "arcee: mlp_bias=true is not supported"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window must be at least 1"),
    # HunYuanDenseV1Attention reads head_dim, null unless config.json gives it
    ({"model_type": "hunyuan_v1_dense"}, "hunyuan_v1_dense: config.json needs head_dim"),
    # HunYuan's own rope type, which the other families' models fail on (a KeyError)
    ({"rope_parameters": {"rope_type": "ntk_alpha", "alpha": 50.0, "rope_theta": 1e4}},
     "llama: rope type 'ntk_alpha' is not supported by this family's model; supported: default"),
    ({"model_type": "gemma3_text", "rope_parameters": {
        "full_attention": {"rope_type": "default"},
        "sliding_attention": {"rope_type": "ntk_alpha", "alpha": 50.0}}},
     "gemma3_text: rope type 'ntk_alpha' is not supported"),
    ({"model_type": "helium", "mlp_bias": True}, "helium: mlp_bias=true is not supported"),
    ({"model_type": "seed_oss", "mlp_bias": True}, "seed_oss: mlp_bias=true is not supported"),
    # MinistralAttention reads head_dim, null unless config.json gives it
    ({"model_type": "ministral"}, "ministral: config.json needs head_dim"),
    ({"model_type": "qwen3_vl", "text_config": None}, "text_config must be an object, got null"),
    ({"model_type": "gemma3", "text_config": []}, "text_config must be an object, got list"),
    ({"model_type": "phi3", "partial_rotary_factor": 1.5}, "rotary dimension 24 does not fit"),
    # MXFP4 weights are read for gpt-oss's experts only
    ({"quantization_config": {"quant_method": "mxfp4"}},
     "llama: the checkpoint is quantized (quantization_config, mxfp4)"),
    ({"model_type": "gpt_oss", "quantization_config": {"quant_method": "hqq"}},
     "gpt_oss: the checkpoint is quantized (quantization_config, hqq)"),
    ({"model_type": "olmoe", "clip_qkv": 8.0}, "olmoe: clip_qkv (q/k/v clamped) is not"),
    ({"model_type": "granite_swa", "layer_rope_theta": [1e4, 1e4, 1e4]},
     "granite_swa: layer_rope_theta lists 3 layers; there are 2"),
    ({"model_type": "granite_swa", "num_hidden_layers": 3, "layer_rope_theta": [1e4, 1e4, 2e4]},
     "granite_swa: layer_rope_theta gives the sliding_attention layers 2 rope bases"),
    ({"model_type": "apertus1p5_text", "vocab_size": 128, "output_vocab_size": 100},
     "apertus1p5_text: output_vocab_size 100 (an LM head pruned below vocab_size 128)"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 6},
     "num_experts_per_tok (6) must be 1 to num_experts (4)"),
    ({"model_type": "lfm2_moe"}, "lfm2_moe: config.json needs layer_types"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0],
                          "original_max_position_embeddings": 64}}, "longrope short_factor"),
])
def test_refused_configs_name_what_is_wrong_in_one_line(change, message):
    raw = dict(BASE, **change)
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_ort_flavour_refuses_a_rotary_width_its_kernel_cannot_take():
    from edgeprefill.export.flavors import OrtFlavor

    cfg = ModelConfig.from_hf(dict(BASE, model_type="phi3", head_dim=32,
                                   partial_rotary_factor=0.25))
    with pytest.raises(ExportError, match="rotary dimension to be a multiple of 16.*standard"):
        OrtFlavor(cfg, np.float32, 128)


def test_gemma2_soft_capping_changes_transformers_logits(tmp_path):
    """Guards the gemma2 fixture: its soft-caps are small enough to matter, so the
    exactness tests would catch a graph that ignores them."""
    ids = [prompt_ids(30)]
    capped = reference_logits(build_hf_model("gemma2", tmp_path / "a"), ids[0])
    plain = reference_logits(build_hf_model("gemma2", tmp_path / "b", attn_logit_softcapping=None,
                                            final_logit_softcapping=None), ids[0])
    assert np.abs(capped - plain).max() > 1e-2
    assert torch.tensor(capped).abs().max() < 10.0  # the final cap bounds the logits


def test_inspect_names_the_family_and_its_quirks(bundle):
    from tests.test_cli_errors import cli

    result = cli("inspect", bundle("gemma2"))
    assert result.returncode == 0, result.stderr
    model_line = next(line for line in result.stdout.splitlines() if line.startswith("model"))
    assert model_line.startswith("model       gemma2:")
    quirks = next(line for line in result.stdout.splitlines() if line.startswith("quirks"))
    assert "soft-capping" in quirks and "sliding window 8 on 1 of 2 layers" in quirks


def test_unknown_family_is_one_line_from_the_cli(tmp_path):
    from tests.test_cli_errors import cli

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(dict(BASE, model_type="nonesuch")))
    result = cli("export", hf_dir, "-o", tmp_path / "out")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model_type 'nonesuch' is not supported" in lines[0], lines


def test_a_checkpoint_that_disagrees_with_its_config_is_refused_in_one_line(tmp_path):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model("llama", tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    config["num_key_value_heads"] = 4  # the weights were saved with 2
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "b", ExportOptions(show_progress=False, max_context=64))
    assert "k_proj.weight has shape (32, 64), but config.json implies (64, 64)" in str(err.value)
    assert "\n" not in str(err.value)


# -- config.json read as transformers reads it ---------------------------------------------

# The families transformers has a config class for, which these tests read as the truth;
# a remote-code family (MiniCPM: tests/test_minicpm.py) has no class here.
WITH_CLASS = sorted(f for f in FAMILIES if f in transformers.models.auto.CONFIG_MAPPING)
MINIMAL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


# The keys that make a family's minimal config one export takes (Granite 4: all attention
# layers and no experts, where its config class defaults to mamba layers and 8 experts;
# Nemotron-H: no experts, where its config class defaults to a block of them; Bamba: an
# attention layer, where its config class makes every layer mamba; LFM2-MoE: as many
# layers as the minimal config).
SUPPORTED = {"granitemoehybrid": {"layer_types": ["attention"] * 4, "num_local_experts": 0},
             "lfm2_moe": {"layer_types": ["conv", "full_attention"] * 2},
             **dict.fromkeys(("nemotron_h", "nemotron_h_omni"), {"layers_block_type": [
                 "linear_attention", "mlp", "full_attention", "mlp"]}),
             "bamba": {"attn_layer_indices": [1]},
             "mamba2": {"num_heads": 8, "head_dim": 16},  # hidden x expand = heads x dim
             # xLSTM: q/k as wide as hidden (64), as its cache's 64-rounded width
             "xlstm": {"qk_dim_factor": 1.0},
             # Gemma 3n: its config class shares the KV of 15 layers, more than there are
             "gemma3n_text": {"num_kv_shared_layers": 2}, "gemma3n": {"num_kv_shared_layers": 2},
             # DBRX: transformers 5.24's attention reads attn_config.rope_theta, which its
             # config class does not default
             "dbrx": {"attn_config": {"rope_theta": 10000.0}},
             # their config classes rotate 64 dims (more than MINIMAL's heads have) and
             # list 24 layers
             "gptj": {"rotary_dim": 8}, "codegen": {"rotary_dim": 8},
             "gpt_neo": {"attention_types": [[["global", "local"], 2]]},
             # Jamba: an attention layer among the 4 (its config class's is the 5th of 8);
             # Zamba2: 4 layers (its config class lists 54)
             "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
             "zamba2": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
             # Zamba: two hybrid layers (with one, transformers fails to tie its block)
             "zamba": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
             # Cohere Compass: its model reads a rope dict per layer type, no default
             **dict.fromkeys(("cohere_compass_text", "cohere_compass"), {"rope_parameters": {
                 "full_attention": {"rope_type": "default", "rope_theta": 20000.0}}}),
             # DeepSeek-OCR 2: its model reads a kind per layer, no default
             "deepseek_ocr2": {"mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
             # ERNIE 4.5 VL: 3-D rotary sections that fit MINIMAL's 16-wide heads (its
             # config class's fit 128)
             "ernie4_5_vl_moe": {"rope_parameters": {"rope_type": "default",
                                                     "rope_theta": 500000.0,
                                                     "mrope_section": [3, 3, 2]}},
             # Kimi Linear: an attention layer among the 4 (its config class's first is
             # the 5th)
             "kimi_linear": {"layer_types": ["linear_attention", "full_attention"] * 2},
             # Bailing hybrid: the same (its config class's first is the 6th)
             "bailing_hybrid": {"layer_group_size": 2},
             # Chameleon: its model reads the image tokens' ids, no default
             "chameleon": {"vocabulary_map": {"<image>": 3, "IMGIMGAAZ": 100}},
             # dots.3: as many KV heads as query heads (its config class checks), in its
             # sliding layers too (64 of each by default)
             **dict.fromkeys(("dots3_note_text", "dots3_note"), {
                 "num_key_value_heads": 4, "swa_num_attention_heads": 2,
                 "swa_num_key_value_heads": 2})}


def least(family: str) -> dict:
    """MINIMAL and the keys the family's model cannot do without (FamilySpec.required:
    HunYuan's attention reads head_dim, which its config class leaves null; the language
    model's type where an image-text family takes one kind only: Mistral 3's Ministral 3)."""
    spec = FAMILIES[family]
    text_type = {"model_type": spec.text_types[0]} if spec.text_types else {}
    return {**MINIMAL, **{key: 16 for key in spec.required}, **text_type,
            **SUPPORTED.get(family, {})}


def hf_config(family: str, **keys):
    # Instantiated from the keys config.json would hold, as from_pretrained does; an
    # image-text family (Gemma 3) takes them as its text_config.
    if FAMILIES[family].nested:
        return transformers.AutoConfig.for_model(
            family, text_config={**least(family), **keys}, **IMAGE_TEXT[family])
    return transformers.AutoConfig.for_model(family, **{**least(family), **keys})


def minimal_raw(family: str, **keys) -> dict:
    """config.json of `family` holding least(family) and `keys` (in text_config where
    nested)."""
    nested = FAMILIES[family].nested
    if nested:
        return {"model_type": family, nested: {**least(family), **keys}}
    return {"model_type": family, **least(family), **keys}


def hf_theta(config, layer_type: str = "full_attention") -> float:
    params = config.rope_parameters
    return float((params.get(layer_type) if layer_type != "full_attention"
                  else full_entry(params))["rope_theta"])


def full_entry(params: dict) -> dict:
    """The full-attention layers' rope: their entry where keyed by layer type (ZAYA's is
    `hybrid`), else the whole dict."""
    return params.get("full_attention") or params.get("hybrid") or params


# The families whose positions are a learned table (GPT-2's wpe), with no rotary at all.
LEARNED_POSITIONS = ("gpt2", "gpt_bigcode", "gpt-sw3", "openai-gpt", "opt", "gpt_neo",
                     "biogpt", "xglm", "ctrl")  # XGLM's and CTRL's tables are fixed sinusoids
# The families whose rotary is a table of their own (GPT-J's create_sinusoidal_positions on
# the base 10000 over rotary_dim), not a rope_parameters dict.
OWN_ROTARY = ("gptj", "codegen")
# ... and those without rotary nor positions (Nemotron-H, Mamba-2, Mamba-1: their mamba
# layers order the tokens; Kimi Linear: its KDA layers; RWKV: its token shifts and WKV;
# xLSTM: its mLSTM cells).
NO_ROTARY = (*LEARNED_POSITIONS, "nemotron_h", "mamba2", "mamba", "falcon_mamba", "jamba",
             "zamba", "zamba2", "nemotron_h_omni", "kimi_linear",  # (Kimi: NoPE MLA)
             "rwkv", "xlstm")
ALIBI = ("bloom", "mpt")  # ... and those whose attention biases by distance instead
INKLING = ("inkling_text", "inkling_mm_model")  # a learned bias by distance, no rope


# The families whose norms' eps is their model's constant, not a config key.
# OlmoLayerNorm's; torch's LayerNorm default (DBRX; OPT, XGLM, BioGPT: BioGptConfig's
# layer_norm_eps is a key its model never reads)
FIXED_EPS = {"olmo": 1e-5, "dbrx": 1e-5, "opt": 1e-5, "xglm": 1e-5, "biogpt": 1e-5}


@pytest.mark.parametrize("family", WITH_CLASS)
def test_keys_a_config_leaves_out_take_transformers_defaults(family):
    if FAMILIES[family].latent_layers:  # transformers refuses a global read of its sizes
        pytest.skip("dots.3's sizes are per layer: test_dots3 reads them layer by layer")
    ours = ModelConfig.from_hf(minimal_raw(family))
    hf = hf_config(family).get_text_config()
    per_layer = FAMILIES[family].per_layer_heads  # Gemma 4: head sizes per layer kind
    head_dim = hf.per_layer_config[hf.layer_types.index("sliding_attention")].head_dim \
        if per_layer else getattr(hf, "head_dim", None) or MINIMAL["hidden_size"] // 4
    latent = FAMILIES[family].latent  # MLA: hf's head_dim is the rope part
    if latent:  # the bundle's one cached head: rope part and latent
        assert (ours.latent.q_lora_rank, ours.latent.nope_dim, ours.latent.v_dim) == (
            hf.q_lora_rank, hf.qk_nope_head_dim, hf.v_head_dim)
        head_dim = hf.qk_rope_head_dim + hf.kv_lora_rank
    if not FAMILIES[family].attention_free:  # Mamba's attention fields are placeholders
        assert ours.head_dim == head_dim
    # (a null one is not the model's: Cohere 2 MoE's rms_norm_eps, LayerNorm where null)
    eps = FIXED_EPS.get(family) or next(
        getattr(hf, k) for k in ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "norm_eps",
                                 "layer_norm_epsilon") if getattr(hf, k, None) is not None)
    assert ours.norm_eps == pytest.approx(eps)
    # no rope: every layer goes without (Inkling: a learned bias by distance instead)
    if family in (*NO_ROTARY, *ALIBI, *INKLING):
        assert [layer.rope for layer in ours.layers] == [None] * len(ours.layers)
    elif family in OWN_ROTARY:
        rotary = meta_model(family).get_decoder().rotary_emb
        assert (ours.ropes[GLOBAL].theta, ours.rotary_dim) == (10000.0, rotary.pos_embd_dim)
    elif (hf.rope_parameters or {}).get("full_attention", True) is None:  # Beam: NoPE full
        assert ours.ropes[LOCAL].theta == pytest.approx(hf_theta(hf, "sliding_attention"))
        assert [layer.rope for layer in ours.layers] == [
            LOCAL if kind == "sliding_attention" else None for kind in hf.layer_types]
    else:
        assert ours.ropes[GLOBAL].theta == pytest.approx(hf_theta(hf))
        partial = full_entry(hf.rope_parameters).get("partial_rotary_factor", 1.0)
        rope = ours.ropes[GLOBAL]
        if per_layer:  # Gemma 4: the whole head turns, its last pairs at frequency 0
            full = hf.per_layer_config[hf.layer_types.index("full_attention")]
            assert rope.rotary_dim == full.head_dim
            assert [layer.head_dim for layer in ours.layers] == [
                full.head_dim if kind == "full_attention" else None for kind in hf.layer_types]
        elif latent:
            # (Mistral 4's head_dim is the whole query head's, partial on its rope part)
            assert rope.rotary_dim == hf.qk_rope_head_dim == round(hf.head_dim * partial)
        elif rope.kind == "proportional":  # LFM3: all of head_dim, the rest not rotating
            assert (rope.rotary_dim, rope.proportion) == (head_dim, partial)
        else:
            assert rope.rotary_dim == int(head_dim * partial)
    assert ours.final_softcap == getattr(hf, "final_logit_softcapping", getattr(
        hf, "logits_soft_cap", getattr(hf, "output_logit_soft_cap", None)))  # RecurrentGemma, xLSTM
    # Mamba-1/2 and BLOOM have no position limit (nor the key): export's cap of 4096 stands
    # for it; MPT's is its alibi table's, max_seq_len
    assert ours.max_positions == getattr(hf, "max_position_embeddings",
                                         getattr(hf, "max_seq_len", 4096))
    act_key = FAMILIES[family].act_key
    if act_key is not None and getattr(hf, act_key, None) is not None:  # BitNet's relu2
        name = getattr(hf, act_key)
        if family == "openai-gpt":  # its afn names modeling_openai.ACT_FNS: gelu is gelu_new
            name = {"gelu": "gelu_new"}.get(name, name)
        assert ours.activation == ACTIVATIONS[name]
    if family == "gemma2":
        assert ours.attn_softcap == hf.attn_logit_softcapping
    if family in ("cohere", "cohere2"):
        assert ours.logits_multiplier == hf.logit_scale
    if family in ("granite", "granitemoehybrid"):
        assert ours.attn_scale == hf.attention_multiplier


@pytest.mark.parametrize("family, keys", [
    ("mistral", {}), ("gemma2", {}), ("gemma3_text", {}),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 2}),
    ("qwen3", {"use_sliding_window": True, "max_window_layers": 2}),
])
def test_a_config_without_sliding_window_slides_as_its_config_class(family, keys):
    # Their config classes' sliding_window is 4096 when config.json has none (a null stays
    # null: no window).
    ours = ModelConfig.from_hf({"model_type": family, **MINIMAL, **keys})
    hf = hf_config(family, **keys)
    types = getattr(hf, "layer_types", None) or ["sliding_attention"] * 4  # Mistral: all
    assert [layer.window for layer in ours.layers] == [
        hf.sliding_window if kind == "sliding_attention" else None for kind in types]
    # Gemma 3's sliding layers use its local rope whatever the window.
    assert [layer.rope for layer in ours.layers] == [
        LOCAL if kind == "sliding_attention" else GLOBAL for kind in types]


@pytest.mark.parametrize("keys", ({}, {"max_position_embeddings": 8192}))
def test_a_phi3_longrope_without_its_windows_takes_phi3s_defaults(keys):
    # Phi3Config: max_position_embeddings 4096 and a top-level original window of 4096 when
    # config.json has none, which wins over the rope dict's.
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 64}
    raw = {"model_type": "phi3", **MINIMAL, **keys, "rope_parameters": rope}
    ours = ModelConfig.from_hf(raw).ropes[GLOBAL]
    hf = hf_config("phi3", **keys, rope_parameters=dict(rope))
    assert (ours.max_positions, ours.original_max_positions) == (
        hf.max_position_embeddings, hf.rope_parameters["original_max_position_embeddings"])
    assert ours.cos_sin_scale() == pytest.approx(model_rotary("phi3", raw).attention_scaling)


@pytest.mark.parametrize("family", WITH_CLASS)
def test_a_sliding_window_key_slides_only_where_the_family_reads_it(family):
    # Llama, Gemma 1, Granite, ... ignore `sliding_window` (configs copied from Mistral's
    # carry it); Qwen2/3 and SmolLM3 read it only with `use_sliding_window: true`.
    for extra in ({}, {"use_sliding_window": True}):
        raw = minimal_raw(family, sliding_window=8, **extra)
        if family == "iquestcoder" and extra:  # its config class refuses the switch
            with pytest.raises(ExportError, match="iquestcoder: use_sliding_window"):
                ModelConfig.from_hf(raw)
            continue
        ours = [layer.window for layer in ModelConfig.from_hf(raw).layers]
        hf = hf_config(family, sliding_window=8, **extra).get_text_config()
        window = getattr(hf, "sliding_window", None)
        types = getattr(hf, "layer_types", None)
        # a wrapper (LLaVA's kin) slides as its default language model
        text = WRAPPERS[family].default_text if family in WRAPPERS else family
        if text == "gpt_neo":  # its own window on its local layers, whatever the key
            expected = [hf.window_size if kind == "local" else None
                        for kind in hf.attention_layers]
        elif text in ("llama", "gemma", "granite", "olmo2", "phi", "stablelm", "cohere",
                      "gpt_neox", "ernie4_5", "ernie4_5_moe", "arcee", "qwen3_vl",
                      "qwen3_vl_moe", "hunyuan_v1_dense", "glm", "glm4", "helium",
                      "seed_oss", "exaone", "granitemoehybrid", "nemotron", "olmoe",
                      "granitemoe", "lfm2_moe", "minicpm3", "youtu", "deepseek_v2",
                      "glm4_moe", "glm4v_moe", "solar_open", "deepseek_v3", "glm4_moe_lite", "axk1",
                      "mistral4",
                      "jetmoe",
                      "longcat_flash",
                      "glm4v", "glm46v",
                      "sarvam_mla", "sarvam_moe",
                      "bitnet", "apertus", "apertus1p5_text", "iquestcoder", "jais2", "olmo",
                      "hyperclovax", "granitemoeshared",
                      "nanochat", "gptj", "codegen", "falcon", "persimmon", "internlm3",
                      "hunyuan_v1_moe", "dbrx", "flex_olmo", "minimax_m2", "emu3", "diffllama",
                      "emu3_text_model", "gpt_neox_japanese", "mllama", "mllama_text_model",
                      "paddleocr_vl", "hy_v3", "aria_text",
                      "qwen3_omni_moe_thinker", "chameleon", *NO_ROTARY, *ALIBI,
                      # stop 43's image-text families of a config class of their own
                      "cosmos3_edge", "deepseek_ocr2", "ernie4_5_vl_moe", "glm_ocr", "glmga",
                      "granite4_vision", "granite_docling",
                      "molmo2"):
            expected = [None] * len(ours)  # Nemotron-H: 2 layers of its 4 blocks
        elif text in INKLING:  # its layer_types' own names
            expected = [window if t == "hybrid_sliding" else None for t in types]
        elif text == "minimax":  # its window slides every softmax layer
            expected = [window if t == "full_attention" else None for t in types]
        elif types is not None:
            expected = [window if t == "sliding_attention" else None for t in types]
        else:  # Mistral, Phi-3: every layer
            expected = [window] * 4
        assert ours == expected, (extra, types)


ACTIVATION_FUNCTIONS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
                        "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                        "relu2": lambda x: torch.relu(x) ** 2, "relu": torch.relu}


@pytest.mark.parametrize("family", WITH_CLASS)
def test_the_activation_is_read_from_the_key_the_model_reads(family):
    # Gemma 1 (as the others) reads hidden_act, Gemma 2/3 hidden_activation; configs
    # converted between them carry both names.
    keys = {"hidden_act": "silu", "hidden_activation": "gelu"}
    ours = ModelConfig.from_hf(minimal_raw(family, **keys)).activation
    model = meta_model(family, **keys)
    decoder = model.get_decoder()
    if isinstance(decoder, torch.nn.Linear):  # ModernBERT decoder's LM head is `decoder`
        decoder = model.model
    decoder = getattr(decoder, "model", decoder)  # Llama 4's get_decoder: its causal LM
    # GPT-2 and BLOOM: h; MPT and DBRX: blocks
    layers = next(getattr(decoder, name) for name in ("layers", "h", "blocks")
                  if hasattr(decoder, name))
    layer = layers[0]
    if family in ("zamba", "zamba2"):  # no MLP but the shared block's (in a hybrid layer)
        hybrid = next(block for block in layers if hasattr(block, "linear"))
        layer = getattr(hybrid, "shared_transf", None) or hybrid.shared_transformer
    # Granite 4's dense MLP; LFM2's, whose Lfm2MLP calls F.silu whatever the config says
    # (it has no activation module); Nemotron-H's MLP block
    # Mamba-1/2 have no MLP: their hidden_act is the mixer's, after the convolution
    mlp = layer.mixer if family in ("mamba2", "mamba", "falcon_mamba") else \
        getattr(layer, "mlp", None) or getattr(layer, "shared_mlp", None) or \
        getattr(layer, "block_sparse_moe", None) or getattr(layer, "feed_forward", None) or \
        getattr(layer, "mlp_block", None) or \
        getattr(layer, "ffn", None) or \
        (layer if hasattr(layer, "fc1") else None) or \
        next(block.mixer for block in layers if block.block_type == "mlp")
    mlp = getattr(mlp, "experts", mlp)  # a mixture of experts: its experts' activation
    mlp = getattr(mlp, "mlp", mlp)  # DBRX's experts: their GLU
    act = next((getattr(mlp, name) for name in ("act_fn", "activation_fn", "act", "activation",
                                                "gelu_impl")  # BLOOM's
                if hasattr(mlp, name)), torch.nn.functional.silu)
    if isinstance(mlp, torch.nn.Sequential):  # CTRL's: Linear, its activation, Linear
        act = mlp[1]
    x = torch.linspace(-4, 4, 101)
    torch.testing.assert_close(ACTIVATION_FUNCTIONS[ours](x), act(x))


# The language models transformers saves alone from an image-text checkpoint, whose config
# classes no auto class maps: their causal LM class.
SAVED_ALONE = {"emu3_text_model": "Emu3ForCausalLM", "mllama_text_model": "MllamaForCausalLM",
               # Step 3.7's language model: transformers has no causal LM of it alone
               "step3p5": "Step3p7TextModel"}


def meta_model(family: str, **keys):
    """The family's transformers model of hf_config(family, **keys) on the meta device: its
    modules and weight shapes without the weights (Gemma 4's default per-layer embedding
    table of 262,144 rows took 20 s to initialise per model)."""
    config = hf_config(family, pad_token_id=0, **keys)
    with torch.device("meta"):
        if family == "gemma3n":  # its vision tower is a timm model (timm is not installed):
            # the language model alone, which is what export reads
            return transformers.Gemma3nForCausalLM(config.get_text_config())
        if family in TIMM_TOWERS:  # as Gemma 3n's: the language model alone
            return transformers.AutoModelForCausalLM.from_config(config.get_text_config())
        if family in SAVED_ALONE:  # a text config of no auto class: its causal LM's
            return getattr(transformers, SAVED_ALONE[family])(config)
        return hf_auto_class(family).from_config(config)


# cached: the switch test compares each of its four switches with the same unswitched
# shapes, and building a meta model was most of its time (callers only compare them)
@functools.cache
def weight_shapes(family: str, **keys) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in meta_model(family, **keys).state_dict().items()}


# The switches export honours (the Mamba mixers' projection biases: the fixtures of
# Nemotron-H, Mamba-2 and Mamba-1 set it; GLM-4.5's q/k norms; PaddleOCR-VL's biases on
# every projection; Doge's MLP biases, which its fixture sets; Chameleon's, which
# test_chameleon sets).
HONOURED = {("nemotron_h", "use_bias"), ("mamba2", "use_bias"), ("mamba", "use_bias"),
            ("falcon_mamba", "use_bias"), ("glm4_moe", "use_qk_norm"),
            ("nemotron_h_omni", "use_bias"), ("paddleocr_vl", "use_bias"), ("doge", "mlp_bias"),
            ("chameleon", "mlp_bias")}


# The switches the family's config class refuses alone (InternLM3: mlp_bias without
# attention_bias), and so does export.
CLASS_REFUSED = {("internlm3", "mlp_bias")}


@pytest.mark.parametrize("key", ("mlp_bias", "qk_layernorm", "use_qk_norm", "use_bias"))
@pytest.mark.parametrize("family", WITH_CLASS)
def test_a_switch_is_refused_only_where_the_model_reads_it(family, key):
    # Each switch adds weights where the family's model reads it (MLP biases, q/k norms);
    # configs copied from another family carry it where the model ignores it (a Qwen2
    # config with mlp_bias: true), and such a config exports as without the key.
    raw, switched = minimal_raw(family), minimal_raw(family, **{key: True})
    if (family, key) in CLASS_REFUSED:
        with pytest.raises(ExportError, match=f"{family}: .*{key}"):
            ModelConfig.from_hf(switched)
    elif (family, key) in HONOURED:
        assert ModelConfig.from_hf(switched) != ModelConfig.from_hf(raw)
    elif weight_shapes(family, **{key: True}) != weight_shapes(family):
        with pytest.raises(ExportError, match=f"{family}: .*{key}"):
            ModelConfig.from_hf(switched)
    else:
        assert ModelConfig.from_hf(switched) == ModelConfig.from_hf(raw)


@pytest.mark.parametrize("family, keys", [
    ("starcoder2", {"use_bias": False}),  # no bias on any projection
    ("seed_oss", {"attention_out_bias": False}),  # q/k/v biases only, as the checkpoints
    ("glm", {"attention_bias": False}),
    ("glm4_moe", {"attention_bias": False, "use_qk_norm": False}),  # GLM-4.5-Air's
])
def test_bias_switches_export_as_transformers(tmp_path, family, keys):
    # The fixtures switch these biases on; their models' other setting is the checkpoints'
    # (StarCoder2's and Seed-OSS's biases follow config keys, not the family).
    hf_dir = build_hf_model(family, tmp_path / "hf", **keys)
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


def test_gpt_neox_ignores_num_key_value_heads(tmp_path):
    # GPTNeoXAttention's fused projection is always 3 x hidden: no grouped KV heads.
    hf_dir = build_hf_model("gpt_neox", tmp_path / "hf", hidden_size=128,
                            num_attention_heads=4, num_key_value_heads=2)  # head_dim 32
    assert json.loads((hf_dir / "config.json").read_text())["num_key_value_heads"] == 2
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rope_parameters", [
    {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}},
    {"full_attention": {"rope_type": "linear", "factor": 4.0},
     "sliding_attention": {"rope_type": "default"}},
    {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
], ids=("no sliding entry", "sliding entry without theta", "no full entry"))
def test_gemma3_local_and_global_ropes_are_the_models(rope_parameters):
    raw = {"model_type": "gemma3_text", **MINIMAL, "head_dim": 16, "sliding_window": 8,
           "sliding_window_pattern": 4,  # layers 0-2 slide, layer 3 is global
           "rope_parameters": rope_parameters}
    assert_local_and_global_ropes_are_the_models("gemma3_text", raw)


def assert_local_and_global_ropes_are_the_models(model_type: str, raw: dict) -> None:
    """Layers 0-2 slide, layer 3 is global, and each table is the model's own."""
    ours = ModelConfig.from_hf(raw)
    assert [layer.rope for layer in ours.layers] == [LOCAL, LOCAL, LOCAL, GLOBAL]
    rotary = model_rotary(model_type, raw)
    for name, layer_type in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        rope = ours.ropes[name]
        freqs = np.outer(np.arange(256, dtype=np.float32), rope.inv_freq())
        np.testing.assert_allclose(np.cos(freqs) * np.float32(rope.cos_sin_scale()),
                                   model_cos(rotary, 256, model_type, layer_type),
                                   atol=1e-4, err_msg=layer_type)


@pytest.mark.parametrize("keys", [
    {},
    {"rope_theta": 10000.0},
    {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 5e3}}},
    {"rope_scaling": {"rope_type": "linear", "factor": 4.0},
     "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 5e3}}},
], ids=("defaults", "legacy theta", "legacy scaling", "per layer type", "both"))
def test_olmo3_local_and_global_ropes_are_the_models(keys):
    # Olmo3Config gives a legacy rope_theta and rope_scaling to the global layers only.
    raw = {"model_type": "olmo3", **MINIMAL, "sliding_window": 8, **keys}
    assert_local_and_global_ropes_are_the_models("olmo3", raw)


@pytest.mark.parametrize("window", (8, None))
def test_exaone4_global_layers_rotate_only_without_a_window(tmp_path, window):
    # Exaone4Attention applies rotary where `sliding_window is None or is_sliding`: with a
    # window the global layers go without; without one every layer rotates.
    types = ["sliding_attention", "full_attention"] if window else ["full_attention"] * 2
    raw = {"model_type": "exaone4", **MINIMAL, "num_hidden_layers": 2, "layer_types": types,
           "sliding_window": window}
    assert [layer.rope for layer in ModelConfig.from_hf(raw).layers] == (
        [LOCAL, None] if window else [GLOBAL, GLOBAL])
    hf_dir = build_hf_model("exaone4", tmp_path / "hf", sliding_window=window,
                            layer_types=types)
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys", [
    {"rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}},
    {"rope_parameters": {"rope_type": "dynamic", "alpha": 50.0, "factor": 4.0, "rope_theta": 1e5}},
    {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
    {"rope_parameters": {"rope_type": "ntk_alpha", "alpha": 50.0, "rope_theta": 1e5}},
    {"rope_parameters": {"rope_type": "linear", "alpha": 50.0, "factor": 2.0,
                         "rope_theta": 1e4}},
    {},
], ids=("hub checkpoints", "alpha", "dynamic without alpha", "ntk_alpha", "alpha ignored",
        "defaults"))
def test_hunyuan_ropes_are_the_models(keys):
    # HunYuanDenseV1RotaryEmbedding: a "dynamic" rope with an alpha stretches the base by
    # alpha ** (d / (d - 2)) at every length; without one it is transformers' dynamic rope.
    raw = {"model_type": "hunyuan_v1_dense", **least("hunyuan_v1_dense"), **keys}
    rope = ModelConfig.from_hf(json.loads(json.dumps(raw))).ropes[GLOBAL]
    freqs = np.outer(np.arange(2048, dtype=np.float32), rope.inv_freq())
    np.testing.assert_allclose(np.cos(freqs), model_cos(model_rotary("hunyuan_v1_dense", raw),
                                                        2048), atol=1e-5)


# A config with both rope keys (a transformers 5 save of an older config, edited by
# hand): the legacy `rope_scaling` replaces `rope_parameters` whole, its theta and partial
# rotary factor included, which then come from the top level or the class's defaults.
BOTH_ROPES = {
    "llama": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
              "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "qwen2": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
              "rope_scaling": {"type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 1024},
              "rope_theta": 50000.0},
    "gpt_neox": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0,
                                     "partial_rotary_factor": 1.0},
                 "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "phi3": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
             "rope_scaling": {"type": "longrope", "short_factor": SHORT[:8],
                              "long_factor": LONG[:8]},
             "original_max_position_embeddings": 1024},
}


@pytest.mark.parametrize("family", sorted(BOTH_ROPES))
def test_rope_scaling_wins_over_rope_parameters_as_in_transformers(family):
    raw = {**BASE, "model_type": family, **BOTH_ROPES[family]}
    if family == "gpt_neox":
        raw["num_key_value_heads"] = 4
    rotary = model_rotary(family, json.loads(json.dumps(raw)))  # the class edits its dicts
    rope = ModelConfig.from_hf(raw).for_context(2048).ropes[GLOBAL]
    assert rope.kind != BOTH_ROPES[family]["rope_parameters"]["rope_type"]
    freqs = np.outer(np.arange(2048, dtype=np.float32), rope.inv_freq())
    np.testing.assert_allclose(np.cos(freqs) * np.float32(rope.cos_sin_scale()),
                               model_cos(rotary, 2048, family), atol=1e-4)


def test_gemma3_rope_scaling_updates_the_global_entry_of_rope_parameters():
    # Gemma3TextConfig merges a legacy rope_scaling into rope_parameters' full_attention
    # (its keys winning), and leaves the local layers' rope alone.
    raw = {"model_type": "gemma3_text", **MINIMAL, "head_dim": 16, "sliding_window": 8,
           "sliding_window_pattern": 4, "rope_scaling": {"rope_type": "linear", "factor": 4.0},
           "rope_parameters": {
               "full_attention": {"rope_type": "default", "rope_theta": 5e4},
               "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e3}}}
    assert ModelConfig.from_hf(raw).ropes[GLOBAL].theta == 5e4
    assert_local_and_global_ropes_are_the_models("gemma3_text", raw)


def test_legacy_values_read_as_transformers_rewrites_them():
    gemma = ModelConfig.from_hf({"model_type": "gemma", **MINIMAL, "hidden_act": "gelu"})
    assert gemma.activation == "gelu_tanh"
    neox = ModelConfig.from_hf({"model_type": "gpt_neox", **MINIMAL, "rotary_emb_base": 100.0})
    assert neox.ropes[GLOBAL].theta == 100.0
    phi3 = ModelConfig.from_hf({"model_type": "phi3", **MINIMAL, "max_position_embeddings": 512,
                                "original_max_position_embeddings": 256, "rope_scaling": {
                                    "type": "su", "short_factor": [1.0] * 8,
                                    "long_factor": [2.0] * 8}})
    assert phi3.ropes[GLOBAL].kind == "longrope"
    gemma3 = ModelConfig.from_hf({"model_type": "gemma3_text", **MINIMAL,
                                  "attn_logit_softcapping": 2.0})
    assert gemma3.attn_softcap is None  # Gemma 3 stores it and never applies it


def test_a_yarn_rope_without_its_original_window_uses_max_position_embeddings():
    raw = {"model_type": "llama", **MINIMAL, "max_position_embeddings": 512,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    ours = ModelConfig.from_hf(raw).ropes[GLOBAL]
    hf = hf_config("llama", max_position_embeddings=512,
                   rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert ours.original_max_positions == hf.rope_parameters[
        "original_max_position_embeddings"] == 512


@pytest.mark.parametrize("family, key_part", [
    ("minicpm3", "rotated key part"), ("deepseek_v3", "rotated key part"),
    ("bailing_hybrid", "rotated key part"), ("kimi_linear", "NoPE key part"),
])
def test_the_latent_key_part_is_called_rotated_only_where_its_layers_rotate(family, key_part):
    # The MLA quirk had called Kimi Linear's cached key part "rotated", though its
    # layers' rope is None (k_pe cached as projected). The reference: the layers' ropes.
    cfg = ModelConfig.from_hf(minimal_raw(family))
    rotates = any(cfg.layers[i].rope is not None for i in cfg.kv_layers)
    assert rotates == (key_part == "rotated key part")
    quirks = model_quirks(cfg)
    assert [q for q in quirks if "rotated" in q or "NoPE key" in q] == [
        f"KV cache: one head of {cfg.head_dim} per token and layer ({key_part} "
        f"{cfg.latent.rope_dim} + latent {cfg.latent.kv_lora_rank})"]


HYBRID_ROPE_CASES = [
    # (family, keys, the layers that attend, the phrase): the reference is the layer
    # pattern written here, each family's attention layers read off it by hand.
    ("kimi_linear", {"layer_types": ["linear_attention"] * 3 + ["full_attention"]},
     [3], "1 of 1 attention layers without rope"),
    ("nemotron_h", {}, [1], "1 of 1 attention layers without rope"),
    ("jamba", {}, [1, 3], "2 of 2 attention layers without rope"),
    ("granitemoehybrid", {"layer_types": ["mamba", "attention", "mamba", "attention"]},
     [1, 3], "2 of 2 attention layers without rope"),
    ("granitemoehybrid", {"layer_types": ["attention"] * 4}, [0, 1, 2, 3],
     "4 of 4 layers without rope"),
    ("exaone4", {"sliding_window": 4096}, [0, 1, 2, 3], "1 of 4 layers without rope"),
    ("granitemoehybrid", {"layer_types": ["mamba", "attention", "mamba", "attention"],
                          "position_embedding_type": "rope"}, [1, 3], None),
    ("qwen3_5_text", {}, [3], None), ("bailing_hybrid", {}, [1, 3], None),
    ("lfm2", {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
     [1, 3], None),
]


@pytest.mark.parametrize("family, keys, attending, phrase", HYBRID_ROPE_CASES)
def test_layers_without_rope_are_counted_among_the_attention_layers(
        family, keys, attending, phrase):
    # Kimi Linear's inspect had said "4 of 4 layers without rope" though three of its
    # layers are KDA, with no attention to take a rope: a state layer's rope is no news.
    cfg = ModelConfig.from_hf(minimal_raw(family, **keys))
    assert [i for i in range(cfg.num_layers)
            if i in cfg.kv_layers or i in cfg.shared_kv] == attending
    named = [q for q in model_quirks(cfg) if "without rope" in q]
    assert named == ([] if phrase is None else [phrase])


@pytest.mark.parametrize("family, parallel, quirk", [
    ("gpt_neox", False, None), ("gpt_neox", True, "parallel residual"),
    ("stablelm", True, "parallel attention and MLP on one norm"), ("stablelm", False, None),
])
def test_the_residual_quirk_follows_the_config(family, parallel, quirk):
    quirks = model_quirks(ModelConfig.from_hf({"model_type": family, **MINIMAL,
                                               "use_parallel_residual": parallel}))
    named = [q for q in quirks if "parallel" in q]
    assert named == ([] if quirk is None else [next(q for q in quirks if q.startswith(quirk))])


MOLMO2 = {**MINIMAL, "model_type": "molmo2_text", "additional_vocab_size": 8}


@pytest.mark.parametrize("raw, post", [
    ({"model_type": "chameleon", **MINIMAL, "vocabulary_map": {}, "swin_norm": True}, True),
    ({"model_type": "chameleon", **MINIMAL, "vocabulary_map": {}, "swin_norm": False}, False),
    ({"model_type": "olmo2", **MINIMAL}, True),
    ({"model_type": "molmo2", "text_config": {**MOLMO2, "norm_after": True}}, True),
    ({"model_type": "molmo2", "text_config": {**MOLMO2, "norm_after": False}}, False),
], ids=["chameleon-swin", "chameleon", "olmo2", "molmo2-norm-after", "molmo2"])
def test_the_norms_after_quirk_follows_the_config(raw, post):
    """Where the config chooses the layers' norms after their sublayers (Chameleon's
    swin_norm, Molmo 2's norm_after; OLMo 2's always), the quirks say so, once."""
    named = [q for q in model_quirks(ModelConfig.from_hf(raw)) if "norm" in q and "after" in q]
    assert named == (["norms after attention and MLP"] if post else [])
