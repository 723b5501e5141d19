"""The family registry: what distinguishes each decoder family from plain Llama, declared.

A family is a `FamilySpec` of switches the graph builder understands (norm kind, block
layout, MLP kind, q/k norms, embedding scaling, tensor names, which layers slide). The
numbers behind the switches (soft-caps, multipliers, windows, rope) are read from
config.json by `ModelConfig.from_hf`; nothing downstream looks at a family's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class TensorNames:
    """Checkpoint tensor names relative to a layer prefix (`layer`, with `{i}`); a tuple
    lists the names one tensor has had across transformers versions, first found wins."""

    embed: tuple[str, ...] = ("model.embed_tokens.weight",)
    final_norm: str = "model.norm"
    lm_head: tuple[str, ...] = ("lm_head",)
    layer: str = "model.layers.{i}."
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    qkv: str | None = None  # one fused projection instead of q, k, v
    o: str = "self_attn.o_proj"
    q_norm: str = "self_attn.q_norm"
    k_norm: str = "self_attn.k_norm"
    gate: str = "mlp.gate_proj"
    up: str = "mlp.up_proj"
    gate_up: str | None = None  # one fused projection, gate first
    down: str = "mlp.down_proj"
    input_norm: str = "input_layernorm"
    post_attn_norm: str = "post_attention_layernorm"
    pre_mlp_norm: str = "pre_feedforward_layernorm"
    post_mlp_norm: str = "post_feedforward_layernorm"


LLAMA_NAMES = TensorNames()

# x*w, x*(1+w) (Gemma), LayerNorm with bias, LayerNorm without bias (Cohere)
NORMS = ("rms", "rms_plus_one", "layer", "layer_no_bias")
# How a layer wires its norms and residual adds (see DecoderBuilder._layer):
#   pre        x += attn(n1(x)); x += mlp(n2(x))                         (Llama)
#   sandwich   x += n2(attn(n1(x))); x += n4(mlp(n3(x)))                 (Gemma 2/3)
#   post       x += n2(attn(x)); x += n4(mlp(x))                         (OLMo 2)
#   parallel   x += attn(n1(x)) + mlp(n2(x))                             (GPT-NeoX)
#   shared     x += attn(n1(x)) + mlp(n1(x))                             (Phi, parallel StableLM)
BLOCKS = ("pre", "sandwich", "post", "parallel", "shared")


@dataclass(frozen=True)
class FamilySpec:
    names: TensorNames = LLAMA_NAMES
    norm: str = "rms"  # one of NORMS
    block: str = "pre"  # one of BLOCKS
    gated_mlp: bool = True  # act(gate) * up, else act(fc1)
    qkv_bias: bool = False  # q/k/v biases when config.json has no `bias_key`
    bias_key: str | None = None  # the config key that switches q/k/v biases on
    o_bias: bool | None = False  # None: the same as the q/k/v biases
    mlp_bias: bool = False
    qkv_interleaved: bool = False  # fused qkv rows ordered [head, q|k|v, dim] (GPT-NeoX)
    rope_interleaved: bool = False  # rotary pairs are dims (2i, 2i+1), not (i, i + D/2)
    lm_head_bias: bool = False
    qk_norm: str | None = None  # None, "head" (per head, before rotary) or "full" (whole q/k)
    embed_scale: str | None = None  # None, "sqrt_hidden" (Gemma) or "multiplier" (Granite)
    tie_default: bool = False
    act_default: str = "silu"
    # Which layers slide when config.json has no `layer_types`: layer index, config -> bool.
    sliding: Callable[[int, dict[str, Any]], bool] = lambda i, raw: True
    # Quirks worth naming to a user (README, manifest, `inspect`).
    quirks: tuple[str, ...] = ()
    block_from_config: Callable[[dict[str, Any]], str] | None = None


def _after_max_window_layers(i: int, raw: dict[str, Any]) -> bool:
    return i >= int(raw.get("max_window_layers", 28))


def _every_nth_global(i: int, raw: dict[str, Any]) -> bool:
    return bool((i + 1) % int(raw.get("sliding_window_pattern", 6)))


def _parallel_if_configured(raw: dict[str, Any]) -> str:
    return "shared" if raw.get("use_parallel_residual") else "pre"


# Llama's convention: `attention_bias` switches the q/k/v and o biases on together.
ATTENTION_BIAS: dict[str, Any] = {"bias_key": "attention_bias", "o_bias": None}
GEMMA = FamilySpec(
    **ATTENTION_BIAS, norm="rms_plus_one", embed_scale="sqrt_hidden", tie_default=True,
    act_default="gelu_pytorch_tanh",
    quirks=("embedding x sqrt(hidden)", "(1+w) RMSNorm", "gelu-tanh MLP"),
)
SANDWICH = ("norms before and after attention and MLP", "query_pre_attn_scalar")
NEOX_NAMES = TensorNames(
    embed=("gpt_neox.embed_in.weight",), final_norm="gpt_neox.final_layer_norm",
    lm_head=("embed_out", "lm_head"), layer="gpt_neox.layers.{i}.",
    qkv="attention.query_key_value", o="attention.dense",
    gate="", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
PHI_NAMES = TensorNames(final_norm="model.final_layernorm", o="self_attn.dense",
                        gate="", up="mlp.fc1", down="mlp.fc2")

FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(**ATTENTION_BIAS),
    "mistral": FamilySpec(),
    "qwen2": FamilySpec(qkv_bias=True, sliding=_after_max_window_layers,
                        quirks=("q/k/v biases",)),
    "qwen3": FamilySpec(**ATTENTION_BIAS, qk_norm="head", sliding=_after_max_window_layers,
                        quirks=("per-head q/k RMSNorm",)),
    "gemma": GEMMA,
    "gemma2": replace(
        GEMMA, block="sandwich", sliding=lambda i, raw: i % 2 == 0,
        quirks=(*GEMMA.quirks, *SANDWICH, "attention and final-logit soft-capping"),
    ),
    "gemma3_text": replace(
        GEMMA, block="sandwich", qk_norm="head", sliding=_every_nth_global,
        quirks=(*GEMMA.quirks, *SANDWICH, "per-head q/k (1+w) RMSNorm",
                "local layers with their own rope base"),
    ),
    "phi3": FamilySpec(
        names=replace(LLAMA_NAMES, qkv="self_attn.qkv_proj", gate_up="mlp.gate_up_proj"),
        quirks=("fused qkv and gate_up weights",),
    ),
    "smollm3": FamilySpec(**ATTENTION_BIAS, tie_default=True),
    "granite": FamilySpec(
        **ATTENTION_BIAS, embed_scale="multiplier",
        quirks=("embedding, attention and residual multipliers", "logits scaling"),
    ),
    "olmo2": FamilySpec(
        **ATTENTION_BIAS, block="post", qk_norm="full",
        quirks=("norms after attention and MLP", "q/k RMSNorm over the whole projection"),
    ),
    "phi": FamilySpec(
        names=PHI_NAMES, norm="layer", block="shared", gated_mlp=False, qkv_bias=True,
        o_bias=True, mlp_bias=True, lm_head_bias=True, act_default="gelu_new",
        quirks=("parallel attention and MLP on one norm", "LayerNorm with bias", "gelu MLP",
                "LM head bias"),
    ),
    "stablelm": FamilySpec(
        norm="layer", bias_key="use_qkv_bias", block_from_config=_parallel_if_configured,
        quirks=("LayerNorm with bias",),
    ),
    "cohere": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
        rope_interleaved=True,
        quirks=("parallel attention and MLP on one norm", "LayerNorm without bias",
                "interleaved rotary", "logit scale"),
    ),
    "gpt_neox": FamilySpec(
        names=NEOX_NAMES, norm="layer", block="parallel", gated_mlp=False,
        qkv_interleaved=True, bias_key="attention_bias", qkv_bias=True, o_bias=None,
        mlp_bias=True, act_default="gelu",
        block_from_config=lambda raw: "parallel" if raw.get("use_parallel_residual", True)
        else "pre",
        quirks=("parallel residual", "LayerNorm with bias", "gelu MLP",
                "fused q/k/v interleaved per head"),
    ),
}
