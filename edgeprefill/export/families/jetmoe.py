"""JetMoE (`jetmoe`: jetmoe/jetmoe-8b), read as transformers' JetMoe reads it: pre-norm
layers whose attention is a mixture of attention heads (export/mixture_attention.py: the
query and output projections routed experts over shared keys and values) and whose MLP
is routed experts (export/moe.py), both routed as Granite MoE's (the top k logits, then
softmax over those k) and each followed by a bias.

Its config class derives the query heads, num_key_value_heads * num_experts_per_tok, and
takes the head size from kv_channels; config.json's own num_attention_heads and head_dim
(where a config holds them) are those it overwrites.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.experts import MoaNames, MoeNames, MoeSpec
from edgeprefill.export.families.spec import FamilySpec


def _jetmoe_heads(raw: dict[str, Any]) -> dict[str, Any]:
    # JetMoeConfig.__post_init__: num_attention_heads = KV heads * k; head_dim is
    # kv_channels (its attribute_map). Values that are no counts are left to the checks
    # (_jetmoe_refuse, the reader's) to refuse in one line.
    kv_heads, top_k = raw.get("num_key_value_heads"), raw.get("num_experts_per_tok")
    heads = kv_heads * top_k if isinstance(kv_heads, int) and isinstance(top_k, int) \
        else raw.get("num_attention_heads")
    return {**raw, "num_attention_heads": heads, "head_dim": raw.get("kv_channels")}


def _jetmoe_refuse(raw: dict[str, Any]) -> str | None:
    """What JetMoeConfig refuses (its validate_architecture), refused as it is: every
    layer's attention is routed experts, so none is no JetMoE."""
    experts, top_k = raw.get("num_local_experts"), raw.get("num_experts_per_tok")
    if not isinstance(experts, int) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        return (f"num_experts_per_tok ({top_k!r}) must be 1 to num_local_experts "
                f"({experts!r})")
    width = raw.get("kv_channels")
    if not isinstance(width, int) or width < 1:  # its attention's head size
        return f"kv_channels must be a positive integer, got {width!r}"
    return None


JETMOE = FamilySpec(
    attention_experts=MoaNames(),
    moe=MoeSpec(names=MoeNames(router=("mlp.router.layer.weight",),
                               expert="mlp.experts.{j}.",
                               fused_gate_up=("mlp.input_linear.weight",),
                               fused_down=("mlp.output_linear.weight",),
                               output_bias="mlp.bias"),
                routing="topk_softmax", experts_keys=("num_local_experts",),
                # JetMoeTopKGating: no renormalizing (a softmax over the k already sums
                # to 1) and no scaling factor
                width_key="intermediate_size", norm_key=None, scaling_key=None),
    act_key="activation_function", tie_default=True, legacy=_jetmoe_heads,
    refuse=_jetmoe_refuse,
    # JetMoeDecoderLayer builds its two norms without an eps (JetMoeRMSNorm's 1e-6); only
    # the model's final norm reads rms_norm_eps
    layer_norm_eps=1e-6,
    # JetMoeConfig's defaults where they differ from the reader's (Llama's)
    defaults={"vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 12,
              "num_key_value_heads": 16, "kv_channels": 128, "intermediate_size": 5632,
              "max_position_embeddings": 4096, "activation_function": "silu",
              "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0},
    quirks=("mixture of attention heads (routed query and output projections over shared "
            "keys and values)", "output biases after the attention and MLP experts"),
)

FAMILIES: dict[str, FamilySpec] = {"jetmoe": JETMOE}
