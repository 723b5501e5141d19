"""Families with Kimi delta attention (KDA, export/kimi_delta.py): Kimi Linear, Bailing
hybrid (Ling 3).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import sparse_mlp_layers
from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.latent import MLA_QUIRKS
from edgeprefill.export.families.moe_sigmoid import DEEPSEEK_MOE, shared_experts
from edgeprefill.export.families.spec import DeltaNames, FamilySpec

# KimiLinearConfig's attribute_map: the Hub's config.json names (and what save_pretrained
# writes) -> the names the reader takes
KIMI_ALIASES = {"model_max_length": "max_position_embeddings",
                "num_experts": "num_local_experts",
                "num_experts_per_token": "num_experts_per_tok",
                "num_shared_experts": "n_shared_experts",
                "moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group"}
# linear_attn_config's keys -> KimiLinearConfig's
KIMI_LINEAR_KEYS = {"head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
                    "short_conv_kernel_size": "linear_conv_kernel_dim"}


def _kimi_linear_config(raw: dict[str, Any]) -> dict[str, Any]:
    """KimiLinearConfig: its aliases and linear_attn_config read as its __post_init__
    reads them (layer_types from the 1-indexed kda_layers and full_attn_layers, else every
    4th layer from the 5th attends; mlp_layer_types dense on the first
    first_k_dense_replace, 1 by default); KDA's heads are its DeltaNet widths (as many
    key heads as value heads, one head_dim); no layer rotates (NoPE)."""
    raw = dict(raw)
    for alias, name in KIMI_ALIASES.items():
        if alias in raw:
            raw[name] = raw[alias]
    linear = raw.get("linear_attn_config") or {}
    for key, name in KIMI_LINEAR_KEYS.items():
        if key in linear:
            raw[name] = linear[key]
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        if "full_attn_layers" in linear and "kda_layers" in linear:
            types: list[str | None] = [None] * count
            for layer in linear["full_attn_layers"]:
                types[int(layer) - 1] = "full_attention"
            for layer in linear["kda_layers"]:
                types[int(layer) - 1] = "linear_attention"
            raw["layer_types"] = types
        else:
            raw["layer_types"] = ["full_attention" if i and i % 4 == 0 else "linear_attention"
                                  for i in range(count)]
    if raw.get("mlp_layer_types") is None:
        dense = int(raw.get("first_k_dense_replace", 1))
        raw["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(count)]
    heads, head_dim = raw["linear_num_heads"], raw["linear_head_dim"]
    raw.update(linear_num_key_heads=heads, linear_num_value_heads=heads,
               linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
               no_rope_layer_interval=1)
    return shared_experts("n_shared_experts")(raw)


def _kimi_linear_unsupported(raw: dict[str, Any]) -> str | None:
    # The KDA convolution takes hidden_act (export's: SiLU); transformers' attention never
    # rotates, whatever mla_use_nope says, and puts experts on every sparse layer, whatever
    # moe_layer_freq says: a checkpoint that sets them otherwise was not trained as it runs.
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: the KDA layers' convolution takes it, "
                "and export's is SiLU")
    if raw.get("mla_use_nope") is False:
        return "mla_use_nope false (rotary in the MLA layers) is not supported"
    if raw.get("moe_layer_freq", 1) != 1:
        return f"moe_layer_freq {raw['moe_layer_freq']} is not supported; only 1"
    if None in raw["layer_types"]:
        return "linear_attn_config's kda_layers and full_attn_layers leave out some layers"
    return None


# Kimi Linear (Kimi-Linear-48B-A3B): KDA layers (three of four) beside DeepSeek-V3's latent
# attention without rotary (NoPE), and DeepSeek-V3's experts on the `sparse` layers of
# mlp_layer_types. Its checkpoints name the MLPs block_sparse_moe (the experts w1, w3 and
# w2, the dense layers' gate/up/down_proj), as transformers saves them and reads them as mlp.
KIMI_LINEAR = FamilySpec(
    **ATTENTION_BIAS, latent=True, delta_net=True, kda=True,
    delta_names=DeltaNames(mixer="self_attn.", projections=("q_proj", "k_proj", "v_proj"),
                           conv=("q_conv1d", "k_conv1d", "v_conv1d"), out="o_proj",
                           norm="o_norm"),
    legacy=_kimi_linear_config, refuse=_kimi_linear_unsupported,
    segment_renames=((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."),
                     (".w3.", ".up_proj."), (".w2.", ".down_proj.")),
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    # KimiLinearConfig's defaults (Kimi-Linear-48B-A3B's)
    defaults={"vocab_size": 163_840, "hidden_size": 2304, "intermediate_size": 9216,
              "moe_intermediate_size": 1024, "num_hidden_layers": 27,
              "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
              "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
              "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
              "norm_topk_prob": True, "hidden_act": "silu",
              "max_position_embeddings": 1_048_576, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "num_local_experts": 256,
              "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4},
    quirks=(*MLA_QUIRKS, "MLA without rotary (NoPE)",
            "KDA: the gated delta rule with a decay per key channel"),
)



def _bailing_hybrid_config(raw: dict[str, Any]) -> dict[str, Any]:
    """BailingHybridConfig: Kimi's aliases; KDA's heads are the attention's
    (num_attention_heads of head_dim, read before DeepseekV3Config turns head_dim into
    qk_rope_head_dim), its kernel short_conv_kernel_size, unless config.json holds the
    linear_* keys it saves them as; without layer_types the last layer of every
    layer_group_size attends; mlp_layer_types dense on the first first_k_dense_replace."""
    raw = dict(raw)
    for alias, name in KIMI_ALIASES.items():
        if alias in raw:
            raw[name] = raw[alias]
    count, group = int(raw["num_hidden_layers"]), int(raw["layer_group_size"])
    if raw.get("layer_types") is None:
        raw["layer_types"] = ["full_attention" if (i + 1) % group == 0 else "linear_attention"
                              for i in range(count)]
    if raw.get("mlp_layer_types") is None:
        dense = int(raw["first_k_dense_replace"])
        raw["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(count)]
    # (the linear_* keys save_pretrained writes win, as the config class sets them last)
    heads = raw.get("linear_num_heads", raw["num_attention_heads"])
    head_dim = raw.get("linear_head_dim", raw["head_dim"])
    raw.update(linear_num_key_heads=heads, linear_num_value_heads=heads,
               linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
               linear_conv_kernel_dim=raw.get("linear_conv_kernel_dim",
                                              raw["short_conv_kernel_size"]))
    return shared_experts("n_shared_experts")(raw)


def _bailing_hybrid_unsupported(raw: dict[str, Any]) -> str | None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: the KDA layers' convolution takes it, "
                "and export's is SiLU")
    return None


# Bailing hybrid (Ling 3: inclusionAI's Ling-3.0-Flash): KDA layers with full-rank decay
# and output-gate projections and a bounded decay (kda_safe_gate), the last layer of every
# group DeepSeek-V3's latent attention (rotary on interleaved pairs) with a sigmoid output
# gate per head; DeepSeek-V3's experts. Its checkpoints' names (word_embeddings,
# `attention`, `dense`, the gate's `expert_bias`) read as transformers renames them.
BAILING_HYBRID = replace(
    KIMI_LINEAR, kda_full_rank=True, latent_head_gate=True, rope_interleaved=True,
    legacy=_bailing_hybrid_config, refuse=_bailing_hybrid_unsupported,
    renames=(("model.word_embeddings.", "model.embed_tokens."),),
    segment_renames=((".attention.", ".self_attn."), (".self_attn.dense.", ".self_attn.o_proj."),
                     (".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")),
    # BailingHybridConfig's defaults (Ling-3.0-Flash's)
    defaults={"vocab_size": 157_184, "hidden_size": 2560, "intermediate_size": 6144,
              "moe_intermediate_size": 768, "num_hidden_layers": 42,
              "num_attention_heads": 32, "num_key_value_heads": 32, "num_local_experts": 512,
              "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
              "routed_scaling_factor": 2.5, "norm_topk_prob": True,
              "first_k_dense_replace": 2, "hidden_act": "silu",
              "max_position_embeddings": 262_144, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "kv_lora_rank": 512, "q_lora_rank": None,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "rope_theta": 6_000_000.0, "head_dim": 128, "short_conv_kernel_size": 4,
              "layer_group_size": 6, "kda_safe_gate": True, "kda_lower_bound": -5.0},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "a sigmoid output gate per MLA head",
            "KDA: the gated delta rule with a decay per key channel (bounded)"),
)

FAMILIES: dict[str, FamilySpec] = {
    "kimi_linear": KIMI_LINEAR,
    "bailing_hybrid": BAILING_HYBRID,
}
