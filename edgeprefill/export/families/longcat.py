"""LongCat-Flash (Meituan): each model layer is two pre-norm sublayers of DeepSeek-V3's
latent attention and a dense MLP, beside a shortcut mixture of experts whose router may
choose zero-computation (identity) experts.

Export lays model layer i out as decoder layers 2i and 2i + 1 (the "shortcut" block,
DecoderBuilder._shortcut_layer), which are also transformers' cache layers (its attentions'
layer_idx * 2 + j): the stored `model.layers.{i}.self_attn.{j}.`, `input_layernorm.{j}`,
`post_attention_layernorm.{j}` and `mlps.{j}.` are read as layer 2i + j's own, the
experts (`mlp.router.`, `mlp.experts.`) as layer 2i's `moe.` (stored_layout).
"""

from __future__ import annotations

import re
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec
from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.latent import MLA_QUIRKS
from edgeprefill.export.families.spec import FamilySpec

# a sublayer's module of model layer i: layer 2i + j's
_SUBLAYER = re.compile(r"model\.layers\.(\d+)\."
                       r"(self_attn|input_layernorm|post_attention_layernorm|mlps)\.([01])\.")
_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.")


def stored_layout(name: str) -> str:
    """A stored tensor's name as export reads it (the module docstring's layout)."""
    found = _SUBLAYER.match(name)
    if found is not None:
        layer, module, j = found.groups()
        module = "mlp" if module == "mlps" else module
        return f"model.layers.{2 * int(layer) + int(j)}.{module}." + name[found.end():]
    found = _EXPERTS.match(name)
    if found is not None:
        return f"model.layers.{2 * int(found[1])}.moe." + name[found.end():]
    return name


def _config(raw: dict[str, Any]) -> dict[str, Any]:
    """LongcatFlashConfig: num_hidden_layers is 2 x num_layers (an attention each); its
    attribute_map's intermediate_size, moe_intermediate_size, num_experts_per_tok."""
    return {**raw, "num_hidden_layers": 2 * int(raw["num_layers"]),
            "intermediate_size": raw["ffn_hidden_size"],
            "moe_intermediate_size": raw["expert_ffn_hidden_size"],
            "num_experts_per_tok": raw["moe_topk"]}


def _refused(raw: dict[str, Any]) -> str | None:
    # LongcatFlashTopkRouter computes its logits without the classifier's bias, which the
    # model's own code adds: the two would route differently.
    if raw.get("n_routed_experts") == 0:  # every layer's first sublayer is its experts'
        return "n_routed_experts 0 is not supported (LongCat-Flash's layers route to experts)"
    if raw.get("router_bias"):
        return "router_bias (a router classifier bias) is not supported"
    if raw.get("zero_expert_type", "identity") != "identity":
        return f"zero_expert_type {raw['zero_expert_type']!r} is not supported; supported: identity"
    for key in ("mla_scale_q_lora", "mla_scale_kv_lora"):
        if not raw[key]:  # transformers' LongcatFlashMLA scales always
            return f"{key} false is not supported (transformers always scales)"
    # LongcatFlashRotaryEmbedding rotates head_dim dims, its attention qk_rope_head_dim
    if raw.get("head_dim") not in (None, raw["qk_rope_head_dim"]):
        return (f"head_dim {raw['head_dim']} must be qk_rope_head_dim "
                f"({raw['qk_rope_head_dim']}), the dims the attention rotates")
    return None


def _first_sublayers(raw: dict[str, Any]) -> tuple[int, ...]:
    """The decoder layers that compute a model layer's experts: the first of each two."""
    return tuple(range(0, int(raw["num_hidden_layers"]), 2))


# Softmax over the real and the identity experts; the top k of softmax +
# e_score_correction_bias (chooses, never weighs), not renormalized, times
# routed_scaling_factor.
LONGCAT_MOE = MoeSpec(
    names=MoeNames(router=("moe.router.classifier.weight",), expert="moe.experts.{j}.",
                   fused_gate_up=("moe.experts.gate_up_proj",),
                   fused_down=("moe.experts.down_proj",),
                   expert_bias=("moe.router.e_score_correction_bias",)),
    routing="softmax_bias", experts_keys=("n_routed_experts",), layers=_first_sublayers,
    norm_key=None, bias_key=None, zero_key="zero_expert_num")

LONGCAT_FLASH = FamilySpec(
    **ATTENTION_BIAS, latent=True, rope_interleaved=True, block="shortcut",
    legacy=_config, refuse=_refused, moe=LONGCAT_MOE, stored_layout=stored_layout,
    left_out=("model.mtp.",),  # its multi-token-prediction layer, which transformers ignores
    defaults={"vocab_size": 131072, "hidden_size": 6144, "num_layers": 28,
              "num_attention_heads": 64, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "ffn_hidden_size": 12288, "q_lora_rank": 1536,
              "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "moe_topk": 12, "n_routed_experts": 512,
              "zero_expert_num": 256, "expert_ffn_hidden_size": 2048,
              "routed_scaling_factor": 6.0, "rope_theta": 10000000.0,
              "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "two attention + MLP sublayers per layer",
            "shortcut experts with identity experts", "query and latent LoRA scaling"),
)

FAMILIES: dict[str, FamilySpec] = {"longcat_flash": LONGCAT_FLASH}
