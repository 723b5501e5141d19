"""Mixture-of-experts decoders, declared: how a family names and routes its experts
(`MoeSpec`, in families/spec.py) and what one config.json makes of it (`MoeConfig`, read once by
`read_moe`). The graph of the block is export/moe.py's.

Routing, as each family's transformers router computes it (float32 throughout):
  softmax          softmax over all experts, then the top k (Qwen2/3-MoE, OLMoE);
                   `norm_topk_prob` rescales the k to sum to 1 (the routers of
                   Qwen3.5-MoE, Qwen3-VL-MoE and Mixtral always)
  topk_softmax     the top k logits, then softmax over those k (Granite MoE; gpt-oss, whose
                   router adds a bias to its logits)
  topk_sigmoid     the top k logits, each weight the sigmoid of its logit (Llama 4, whose
                   experts take the token times its weight: `input_scaled`)
  sparsemixer      PhiMoE's (in eval mode, always 2 experts): the best logit's expert, weighed
                   by its softmax over the logits within a relative gap of it, (m - l) /
                   max(|l|, m) <= 2 `router_jitter_noise` (m the best logit); then the same
                   over the logits without that expert, m the second best
  sigmoid          sigmoid of each logit; the top k of sigmoid + `expert_bias` (the bias
                   chooses, it never weighs); `norm_topk_prob` divides by their sum + 1e-6;
                   times `routed_scaling_factor` (LFM2-MoE). DeepSeek-V3's "noaux_tc"
                   (GLM-4.5, dots.llm1, EXAONE-MoE, Solar Open) is this routing with
                   groups: the E experts form `n_group` groups of E / n_group, each scored
                   by the sum of its top 2 biased scores, and the top k are chosen within
                   the best `topk_group` groups (with all of them kept, LFM2-MoE's
                   choice); its sum gets + 1e-20. Kolibri-1 adds its bias to the logits,
                   not to the sigmoid; Laguna soft-caps the logits first
                   (c * tanh(logits / c), `moe_router_logit_softcapping`).
  softmax_bias     softmax over all experts; the top k of softmax + `e_score_correction_bias`
                   (chooses, never weighs); divided by max(their sum, `moe_norm_min`)
                   (ERNIE-4.5-MoE)
  softmax_group_limited
                   softmax over all experts; the experts in `n_group` equal groups, each
                   group ranked by its best score; the top k of the experts in the best
                   `topk_group` groups, weighed by their softmax, times
                   `routed_scaling_factor` (DeepSeek-V2's group_limited_greedy; its greedy
                   is one group)
  inkling          Inkling's (export/inkling.py): the top k of sigmoid + bias choose; the
                   chosen logits and the shared experts' are weighed by one softmax of
                   their log-sigmoids, times route_scale and the router's global_scale;
                   the shared experts' weights scale their outputs
  zaya             ZAYA's own router (export/zaya_router.py): an MLP over a down-projection
                   carried across layers, softmax over the experts and a skip expert, the
                   top 1 of it + `balancing_biases`
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.config_values import given

ROUTINGS = ("softmax", "topk_softmax", "topk_sigmoid", "sigmoid", "softmax_bias",
            "softmax_group_limited", "sparsemixer", "zaya", "inkling")


@dataclass(frozen=True)
class MoeNames:
    """Tensor names relative to a layer prefix. Experts are read one by one from either
    layout a checkpoint may hold: per expert (`experts.{j}.gate_proj.weight`, the Hub's and
    what transformers 5 saves) or fused [E, 2I, H] / [E, H, I] tensors (the transformers 5
    modules' own `experts.gate_up_proj`, Granite MoE's `input_linear`)."""

    router: tuple[str, ...] = ("mlp.gate.weight",)  # first found wins
    expert: str = "mlp.experts.{j}."  # + gate/up/down + ".weight"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    fused_gate_up: tuple[str, ...] = ("mlp.experts.gate_up_proj",)
    fused_down: tuple[str, ...] = ("mlp.experts.down_proj",)
    # Whether the fused tensors may be stored transposed, [E, H, 2I] / [E, I, H] (Qwen3-VL-MoE
    # on the Hub): read as transformers reads them, as stored where the shape is the
    # module's (what save_pretrained writes), else transposed.
    fused_transposable: bool = False
    # the selection bias [E] or [1, E] (LFM2-MoE's, ERNIE-4.5-MoE's); first found wins
    expert_bias: tuple[str, ...] = ()
    # Whether a checkpoint may lack that bias, which then chooses nothing: A.X K1's Hub
    # checkpoints route without one, and transformers leaves its buffer at zero.
    expert_bias_optional: bool = False
    # An RMSNorm (the family's norm) of the block's output, routed + shared, before the
    # residual add: A.X K1's post_mlp_layernorm, which its Hub checkpoints store at the
    # layer's level and transformers' modules under mlp; first found wins. (): none.
    output_norm: tuple[str, ...] = ()
    # Experts split by modality (ERNIE 4.5 VL): the layer's list holds each modality's
    # `experts` in turn, the text's first (export/modality_experts.py), its selection bias
    # a row per modality [modalities, E]; and its router stored [H, E], its module's own
    modalities: int = 1
    router_hidden_first: bool = False
    router_bias: str | None = None  # added to the router's logits (gpt-oss)
    # the experts' own biases, fused [E, 2I] (rows as the fused gate_up's) and [E, H]
    gate_up_bias: str | None = None
    down_bias: str | None = None
    # gpt-oss's fused layout: gate and up rows interleaved (g0, u0, g1, ...) and the fused
    # tensors stored [E, in, out] (GptOssExperts' gate_up_proj [E, H, 2I], down_proj
    # [E, I, H]); the Hub's checkpoints store them as MXFP4 `_blocks`/`_scales` of the
    # [E, out, in] weights instead (export/mxfp4.py), which config.json's
    # quantization_config (quant_method mxfp4) announces
    interleaved: bool = False
    transposed: bool = False
    mxfp4: bool = False
    # DBRX's layout: gate, up and down each one tensor [E * I, H], expert e's rows
    # e * I to (e + 1) * I (the down's are its [I, H], in by out); None: as above
    stacked: tuple[str, str, str] | None = None
    # Step 3.7's Hub layout: gate and up each one tensor [E, I, H] (moe.gate_proj.weight,
    # moe.up_proj.weight), read where the layer has them; its down is `fused_down`'s
    split_gate_up: tuple[str, str] | None = None
    shared: str | None = None  # a shared expert's MLP prefix (Qwen2-MoE), + gate/up/down
    shared_gate: str | None = None  # its sigmoid gate [1, H]; None: ungated (ERNIE)
    # a shared MLP whose gate and up are one projection, gate first, and its down (Granite
    # MoE Shared's input_linear and output_linear); None: gate, up and down as above
    shared_gate_up: str | None = None
    shared_down: str | None = None
    # a bias [H] added to the block's output, routed and shared (JetMoE's mlp.bias)
    output_bias: str | None = None
    # Muse Spark's experts at a width of their own (MoeConfig.inner_width): the router reads
    # the block's input x, the experts read pre_norm(pre_proj(x)) (a projection [M, H] and
    # a norm of the family's kind), each expert's output normed by `expert_norm` (an
    # input-scaled RMSNorm [M], one for every expert) before its weight, and their sum
    # projected back by post_proj [H, M]; None: none of these.
    pre_proj: str | None = None
    pre_norm: str | None = None
    expert_norm: str | None = None
    post_proj: str | None = None


@dataclass(frozen=True)
class MoaNames:
    """JetMoE's mixture of attention heads (export/mixture_attention.py), relative to a
    layer prefix: the router [E, H], the experts' query projections fused [E, KV*D, H] and
    output projections [E, H, KV*D], the bias [H] added to the output, and the keys' and
    values' projection shared by every expert [2 KV*D, H] (keys first)."""

    router: str = "self_attention.experts.router.layer.weight"
    queries: str = "self_attention.experts.input_linear.weight"
    outputs: str = "self_attention.experts.output_linear.weight"
    bias: str = "self_attention.experts.bias"
    kv: str = "self_attention.kv_proj.weight"


def every_layer(raw: dict[str, Any]) -> tuple[int, ...]:
    return tuple(range(int(raw["num_hidden_layers"])))


@dataclass(frozen=True)
class MoeSpec:
    """A family's experts: names, routing and the config keys it reads them from."""

    names: MoeNames = MoeNames()
    routing: str = "softmax"  # one of ROUTINGS
    # the keys of the expert count, first present wins (transformers' attribute_map aliases)
    experts_keys: tuple[str, ...] = ("num_experts",)
    width_key: str = "moe_intermediate_size"
    # config.json -> the layers with experts (the others keep the dense MLP)
    layers: Callable[[dict[str, Any]], tuple[int, ...]] = every_layer
    # The config key that switches renormalizing the top k on; None: the router's own fixed
    # choice, `renormalize` (Granite MoE never; Qwen3.5-MoE, Qwen3-VL-MoE, Mixtral always).
    norm_key: str | None = "norm_topk_prob"
    renormalize: bool = False
    norm_eps: float = 0.0  # added to the sum before renormalizing (LFM2-MoE's 1e-6)
    # the key of a floor of the sum before renormalizing (ERNIE-4.5-MoE's moe_norm_min)
    norm_min_key: str | None = None
    # the key that switches the selection bias on; None: always there where named
    bias_key: str | None = "use_expert_bias"
    # gpt-oss's clamped SwiGLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), with
    # g = min(gate, limit), alpha and limit from swiglu_alpha and swiglu_limit
    clamped_swiglu: bool = False
    # DeepSeek-V3's grouped choice: the router reads `n_group` and `topk_group` (a null
    # counts as 1, one group: dots.llm1's configs hold nulls)
    grouped: bool = False
    # Whether the selection bias is added to the router's logits rather than to its
    # sigmoid scores (Kolibri-1)
    bias_on_logits: bool = False
    # the key of the factor the weights are multiplied by; None: the router has none
    scaling_key: str | None = "routed_scaling_factor"
    # Whether each chosen expert runs on the token times its weight, its output added
    # unweighed (Llama 4's experts take routed_in = x * score), not weight * expert(x)
    input_scaled: bool = False
    # the key of sparsemixer's relative gap (PhiMoE's router_jitter_noise)
    jitter_key: str | None = None
    # The routing where config.json picks it (Cohere 2 MoE's expert_selection_fn): config ->
    # one of ROUTINGS; None: `routing`.
    routing_from_config: Callable[[dict[str, Any]], str] | None = None
    # The key whose "average" halves the sum of the routed and shared experts ("sum" adds
    # them: Cohere 2 MoE's shared_expert_combination_strategy); None: they are added.
    average_key: str | None = None
    # The key of a soft-cap of the router's logits, c * tanh(logits / c) before routing
    # where it is above 0 (Laguna's moe_router_logit_softcapping); None: none.
    softcap_key: str | None = None
    # The key of the count of zero-computation experts the router may also choose, each
    # returning the token itself (LongCat-Flash's zero_expert_num); None: none.
    zero_key: str | None = None
    # The key of the width the experts run at, between the names' pre_proj and post_proj
    # (Muse Spark's moe_hidden_size); None: hidden.
    inner_width_key: str | None = None
    # The key of a factor of the router's logits before routing (Muse Spark's router reads
    # the model's output_multiplier); None: none.
    logit_scale_key: str | None = None
    # The key of the epsilon of names.expert_norm (Muse Spark's post_norm_eps).
    expert_norm_eps_key: str | None = None


# config.json keys that name a routing, and the one value each family here computes
# (DeepSeek-V3's; transformers' routers ignore the keys, so another value would be a
# checkpoint trained to route otherwise)
ROUTING_KEYS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc",
                "moe_router_activation_func": "sigmoid"}  # (Kimi Linear's name)


@dataclass(frozen=True)
class ClampedSwiglu:
    """gpt-oss's expert activation (GptOssExperts._apply_gate)."""

    alpha: float
    limit: float


@dataclass(frozen=True)
class MoeConfig:
    """One model's experts, as its config.json gives them."""

    experts: int
    top_k: int
    width: int  # each expert's intermediate size
    routing: str
    norm_topk: bool
    norm_eps: float
    norm_min: float  # the floor of the sum before renormalizing; 0: none
    scaling: float  # routed_scaling_factor
    expert_bias: bool
    shared_width: int  # a shared expert's intermediate size; 0: none
    shared_gated: bool  # whether its output is gated (Qwen2-MoE), or added whole (ERNIE)
    layers: tuple[int, ...]
    clamped: ClampedSwiglu | None = None  # None: act(gate) * up
    # The experts in `groups` equal groups, the best `top_groups` of which a token's
    # experts come from (1 and 1: every expert): DeepSeek-V2's and -V3's routers.
    groups: int = 1
    top_groups: int = 1
    bias_on_logits: bool = False  # Kolibri-1: the bias is added to the logits
    input_scaled: bool = False  # Llama 4: expert(weight * x), not weight * expert(x)
    jitter: float = 0.0  # sparsemixer: a logit within 2 jitter (relative) of the best counts
    averaged: bool = False  # Cohere 2 MoE: (routed + shared) / 2, where there is a shared MLP
    logit_softcap: float = 0.0  # Laguna: logits -> c * tanh(logits / c) first; 0: none
    # LongCat-Flash: identity experts after the `experts` real ones, routed as any (the
    # router's rows and selection bias cover both); each returns its weight times the token
    zero_experts: int = 0
    inner_width: int = 0  # Muse Spark: the experts' width between two projections; 0: none
    logit_scale: float = 1.0  # Muse Spark: the router's logits times this first
    expert_norm_eps: float | None = None  # Muse Spark: its experts' output norm's epsilon

    @property
    def choices(self) -> int:
        """The router's width: the real experts, then the zero-computation ones."""
        return self.experts + self.zero_experts

    @property
    def grouped(self) -> bool:
        """Whether the choice is limited to some groups (with all of them it is not)."""
        return self.top_groups < self.groups

    def describe(self, num_layers: int) -> str:
        gated = "a gated" if self.shared_gated else "an ungated"
        averaged = " (the two averaged)" if self.averaged else ""
        shared = f", {gated} shared expert of width {self.shared_width}{averaged}" \
            if self.shared_width else ""
        clamped = f", clamped SwiGLU (limit {self.clamped.limit:g})" if self.clamped else ""
        capped = f", router logits soft-capped at {self.logit_softcap:g}" \
            if self.logit_softcap else ""
        groups = f" within the best {self.top_groups} of {self.groups} groups" \
            if self.grouped else ""
        zero = f" and {self.zero_experts} identity experts" if self.zero_experts else ""
        inner = f" on a projection to {self.inner_width}, each output normed" \
            if self.inner_width else ""
        return (f"mixture of experts: {self.experts} experts of width {self.width}{zero}{inner}, "
                f"top {self.top_k} per token{groups} ({self.routing} routing), on "
                f"{len(self.layers)} of {num_layers} layers{shared}{clamped}{capped}")


def read_moe(raw: dict[str, Any], spec: MoeSpec) -> MoeConfig | None:
    """The MoeConfig of config.json as the family reads it (a KeyError names a missing key);
    None where no layer has experts (num_experts 0, as Qwen2/3-MoE's model reads it)."""
    names = spec.names
    key = next((k for k in spec.experts_keys if raw.get(k) is not None), spec.experts_keys[0])
    experts = int(raw[key])
    layers = spec.layers(raw) if experts else ()
    if not layers:
        return None
    moe = MoeConfig(
        experts=experts,
        top_k=int(raw["num_experts_per_tok"]),
        width=int(raw[spec.width_key]),
        routing=spec.routing_from_config(raw) if spec.routing_from_config else spec.routing,
        norm_topk=bool(raw.get(spec.norm_key)) if spec.norm_key else spec.renormalize,
        norm_eps=spec.norm_eps,
        norm_min=float(raw[spec.norm_min_key]) if spec.norm_min_key else 0.0,
        # 0 stays 0 (the experts' output times 0, as every family's block multiplies it);
        # null is 1 (MiMo-V2-Flash's config class reads it so)
        scaling=float(given(raw.get(spec.scaling_key), 1.0)) if spec.scaling_key else 1.0,
        expert_bias=bool(names.expert_bias) and (spec.bias_key is None
                                                  or bool(raw.get(spec.bias_key))),
        shared_width=int(raw.get("shared_expert_intermediate_size") or 0)
        if names.shared else 0,
        shared_gated=names.shared_gate is not None,
        layers=layers,
        clamped=ClampedSwiglu(float(raw["swiglu_alpha"]), float(raw["swiglu_limit"]))
        if spec.clamped_swiglu else None,
        groups=int(raw.get("n_group") or 1) if spec.grouped else 1,
        top_groups=int(raw.get("topk_group") or 1) if spec.grouped else 1,
        bias_on_logits=spec.bias_on_logits,
        input_scaled=spec.input_scaled,
        jitter=float(raw[spec.jitter_key]) if spec.jitter_key else 0.0,
        averaged=bool(spec.average_key) and raw.get(spec.average_key) == "average",
        # as LagunaTopKRouter: only a cap above 0 caps
        logit_softcap=max(float(raw.get(spec.softcap_key) or 0.0), 0.0)
        if spec.softcap_key else 0.0,
        zero_experts=int(raw.get(spec.zero_key) or 0) if spec.zero_key else 0,
        inner_width=int(raw[spec.inner_width_key]) if spec.inner_width_key else 0,
        logit_scale=float(raw[spec.logit_scale_key]) if spec.logit_scale_key else 1.0,
        expert_norm_eps=float(raw[spec.expert_norm_eps_key]) if spec.expert_norm_eps_key
        else None,
    )
    if moe.zero_experts < 0:
        raise ExportError(f"config.json: {spec.zero_key} must be 0 or more, got "
                          f"{moe.zero_experts}")
    if moe.experts < 1 or not 1 <= moe.top_k <= moe.choices:
        raise ExportError(f"config.json: num_experts_per_tok ({moe.top_k}) must be 1 to "
                          f"{key} ({moe.choices})")
    if moe.routing == "sparsemixer" and (moe.top_k != 2 or moe.experts < 2):
        raise ExportError(f"config.json: sparsemixer routing chooses 2 of 2 or more experts; "
                          f"num_experts_per_tok is {moe.top_k}, {key} {moe.experts}")
    if moe.width < 1:
        raise ExportError(f"config.json: {spec.width_key} must be positive, got {moe.width}")
    if spec.inner_width_key and moe.inner_width < 1:
        raise ExportError(f"config.json: {spec.inner_width_key} must be positive, got "
                          f"{moe.inner_width}")
    eps = moe.expert_norm_eps
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise ExportError(f"config.json: {spec.expert_norm_eps_key} must be positive, got {eps}")
    if spec.grouped:
        _check_groups(raw, moe)
    return moe


def _check_groups(raw: dict[str, Any], moe: MoeConfig) -> None:
    """What DeepSeek-V2's and -V3's routers compute: groups that divide the experts and
    leave k experts to choose from; V3's (sigmoid) a routing it names, and groups of 2 or
    more (each is scored by its top 2)."""
    for key, value in ROUTING_KEYS.items() if moe.routing == "sigmoid" else ():
        if raw.get(key) not in (None, value):
            raise ExportError(f"config.json: {key} {raw[key]!r} is not supported (the "
                              f"router computes {value!r})")
    groups, size = moe.groups, moe.experts // max(moe.groups, 1)
    if groups < 1 or moe.experts % groups:
        raise ExportError(f"config.json: n_group ({groups}) must divide the {moe.experts} "
                          "experts")
    if moe.routing in ("sigmoid", "softmax_bias") and groups > 1 and size < 2:
        raise ExportError(f"config.json: n_group ({groups}) leaves fewer than 2 of the "
                          f"{moe.experts} experts per group (each group is scored by its "
                          "top 2)")
    if not 1 <= moe.top_groups <= groups or moe.top_k > moe.top_groups * size:
        raise ExportError(f"config.json: topk_group ({moe.top_groups}) must be 1 to n_group "
                          f"({groups}) and its groups hold num_experts_per_tok "
                          f"({moe.top_k}) experts")


def sparse_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """Qwen2/3-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers`."""
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(raw.get("mlp_only_layers") or ())
    return tuple(i for i in range(int(raw["num_hidden_layers"]))
                 if i not in dense and (i + 1) % step == 0)


def interval_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """ERNIE-4.5-MoE: every `moe_layer_interval`-th layer from `moe_layer_start_index` to
    `moe_layer_end_index` (-1: the last)."""
    count = int(raw["num_hidden_layers"])
    end = int(raw["moe_layer_end_index"])
    end = count - 1 if end == -1 else end
    start, step = int(raw["moe_layer_start_index"]), int(raw["moe_layer_interval"])
    return tuple(i for i in range(count) if (i + 1) % step == 0 and start <= i <= end)


def after_dense_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """LFM2-MoE: the layers after the first `num_dense_layers`."""
    return tuple(range(int(raw.get("num_dense_layers", 2)), int(raw["num_hidden_layers"])))


def after_first_k_dense(raw: dict[str, Any]) -> tuple[int, ...]:
    """DeepSeek-V3 (GLM-4.5, dots.llm1): the layers after the first `first_k_dense_replace`."""
    return tuple(range(int(raw["first_k_dense_replace"]), int(raw["num_hidden_layers"])))


def sparse_mlp_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """EXAONE-MoE: the layers `mlp_layer_types` marks "sparse"; without it, those after the
    first `first_k_dense_replace`."""
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        return after_first_k_dense(raw)
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


def mlp_layer_types_sparse(raw: dict[str, Any]) -> tuple[int, ...]:
    """`mlp_layer_types`' `sparse` layers (every layer where the key is absent): Mellum,
    Hy3, Cohere 2 MoE."""
    kinds = raw.get("mlp_layer_types") or ["sparse"] * int(raw["num_hidden_layers"])
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
