"""The family registry: what distinguishes each decoder family from plain Llama, declared.

A family is a `FamilySpec` of switches the graph builder understands (norm kind, block
layout, MLP kind, q/k norms, embedding scaling, tensor names, which layers slide). The
numbers behind the switches (soft-caps, multipliers, windows, rope) are read from
config.json by `ModelConfig.from_hf`; nothing downstream looks at a family's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    after_dense_layers,
    after_first_k_dense,
    every_layer,
    interval_layers,
    sparse_layers,
    sparse_mlp_layers,
)
from edgeprefill.export.rope import rope_params


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
    # learned absolute positions added to the embedding (GPT-2's `wpe`); None: no such table
    position_embed: str | None = None
    input_norm: str = "input_layernorm"
    post_attn_norm: str = "post_attention_layernorm"
    pre_mlp_norm: str = "pre_feedforward_layernorm"
    post_mlp_norm: str = "post_feedforward_layernorm"
    # LFM3's output gate per head (hidden -> heads), which the Hub's checkpoints call
    # gate_proj and transformers renames g_proj when it loads them
    head_gate: tuple[str, ...] = ("self_attn.g_proj", "self_attn.gate_proj")
    act: str = "mlp.act_fn."  # an activation with weights of its own (Apertus's xIELU)
    mamba: str = "mamba."  # a Mamba-2 layer's mixer module (in_proj, conv1d, norm, ...)
    sinks: str = "self_attn.sinks"  # gpt-oss's attention sinks, one logit per query head
    # Multi-head latent attention (export/latent_attention.py): q_a_proj, its norm and
    # q_b_proj (or `q` alone without q_lora_rank); kv_a_proj_with_mqa, its norm, kv_b_proj
    q_a: str = "self_attn.q_a_proj"
    q_a_norm: str = "self_attn.q_a_layernorm"
    q_b: str = "self_attn.q_b_proj"
    kv_a: str = "self_attn.kv_a_proj_with_mqa"
    kv_a_norm: str = "self_attn.kv_a_layernorm"
    kv_b: str = "self_attn.kv_b_proj"
    # BitNet's sub-norms: an RMSNorm of the attention's output before o_proj, and of the
    # gated MLP's act(gate) * up before down_proj; None: the family has none
    attn_sub_norm: str | None = None
    mlp_sub_norm: str | None = None


LLAMA_NAMES = TensorNames()


@dataclass(frozen=True)
class DeltaNames:
    """A Gated DeltaNet layer's tensor names (export/gated_delta.py), relative to the layer
    prefix + `mixer`. `projections` are the input projections whose rows, stacked in this
    order, are Qwen3.5's q | k | v, z, b and a (each all heads in order); `conv` the
    convolution weights whose channels, stacked, are its q | k | v."""

    mixer: str = "linear_attn."
    projections: tuple[str, ...] = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    conv: tuple[str, ...] = ("conv1d",)
    out: str = "out_proj"
    norm: str = "norm"  # the gated RMSNorm per value head


QWEN_DELTA_NAMES = DeltaNames()

# x*w, x*(1+w) (Gemma), LayerNorm with bias, LayerNorm without bias (Cohere), LayerNorm
# with bias scaling by (1+w) (Nemotron's LayerNorm1P), LayerNorm with neither weight nor
# bias (OLMo 1), RMSNorm without weight (nanochat)
NORMS = ("rms", "rms_plus_one", "layer", "layer_no_bias", "layer_plus_one", "layer_no_affine",
         "rms_no_weight")
# How a layer wires its norms and residual adds (see DecoderBuilder._layer):
#   pre        x += attn(n1(x)); x += mlp(n2(x))                         (Llama)
#   sandwich   x += n2(attn(n1(x))); x += n4(mlp(n3(x)))                 (Gemma 2/3)
#   post       x += n2(attn(x)); x += n4(mlp(x))                         (OLMo 2)
#   parallel   x += attn(n1(x)) + mlp(n2(x))                             (GPT-NeoX)
#   shared     x += attn(n1(x)) + mlp(n1(x))                             (Phi, parallel StableLM)
#   hybrid     x += attn(n1(x)) + mamba(n1(x)); x += mlp(n2(x))          (Falcon-H1)
#   altup      Gemma 3n: the sandwich on AltUp's active stream, with LAuReL (altup.py)
BLOCKS = ("pre", "sandwich", "post", "parallel", "shared", "hybrid", "altup")


@dataclass(frozen=True)
class FamilySpec:
    names: TensorNames = LLAMA_NAMES
    norm: str = "rms"  # one of NORMS
    block: str = "pre"  # one of BLOCKS
    gated_mlp: bool = True  # act(gate) * up, else act(fc1)
    qkv_bias: bool = False  # q/k/v biases when config.json has no `bias_key`
    bias_key: str | None = None  # the config key that switches q/k/v biases on
    o_bias: bool | None = False  # None: the same as the q/k/v biases
    o_bias_key: str | None = None  # a key of its own for the o bias (Seed-OSS), o_bias unset
    mlp_bias: bool | None = False  # None: the same as the q/k/v biases (StarCoder2)
    mlp_bias_key: str | None = None  # a key of its own for the MLP biases (Jais 2), mlp_bias unset
    qkv_interleaved: bool = False  # fused qkv rows ordered [head, q|k|v, dim] (GPT-NeoX)
    rope_interleaved: bool = False  # rotary pairs are dims (2i, 2i+1), not (i, i + D/2)
    lm_head_bias: bool = False
    # None, "head" (per head, before rotary), "head_rotated" (per head, of the rotated q/k:
    # HunYuan) or "full" (the whole q/k projection)
    qk_norm: str | None = None
    # The config key that switches those norms on; None: always there (GLM-4.5's use_qk_norm)
    qk_norm_key: str | None = None
    embed_scale: str | None = None  # None, "sqrt_hidden" (Gemma) or "multiplier" (Granite)
    tie_default: bool = False
    act_default: str = "silu"
    # The key the family's MLP takes its activation from; the other name is ignored there
    # (Gemma 1 reads `hidden_act`, Gemma 2/3 `hidden_activation`, and configs carry both).
    # None: the MLP reads no key, its activation is act_default (LFM2's SiLU).
    act_key: str | None = "hidden_act"
    # The key the family's norms take their epsilon from (StarCoder2's `norm_epsilon`);
    # None: the first of rms_norm_eps, layer_norm_eps, layer_norm_epsilon.
    eps_key: str | None = None
    # Whether the family's model rotates part of each head (`partial_rotary_factor`, or
    # GPT-NeoX's `rotary_pct`): Phi, Phi-3, StableLM, GPT-NeoX and GLM do; the others' default
    # rope rotates all of head_dim, a factor in their config.json notwithstanding.
    partial_rotary: bool = False
    # Whether the family's transformers model reads `sliding_window` at all: "never" (a
    # key some configs carry anyway, which the model ignores), "always", or "opt_in" (only
    # with `use_sliding_window: true`, as Qwen2/3 and SmolLM3 do).
    window: str = "never"
    # Which layers slide when config.json has no `layer_types`: layer index, config -> bool.
    sliding: Callable[[int, dict[str, Any]], bool] = lambda i, raw: True
    # Quirks worth naming to a user (README, manifest, `inspect`).
    quirks: tuple[str, ...] = ()
    block_from_config: Callable[[dict[str, Any]], str] | None = None
    # The tensor names where block_from_config picks a block whose norms the checkpoint
    # names otherwise (LFM3 without sandwich norms: the MLP's norm is ffn_norm, which the
    # "pre" block reads as post_attn_norm); other blocks use `names`.
    block_names: Mapping[str, TensorNames] = field(default_factory=dict)
    # transformers' own defaults for the keys config.json may leave out (the config
    # class's, where they differ from the reader's generic ones), and its rewrites of
    # legacy values: a hand-written or old config reads as transformers reads it.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    legacy: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Switches the family's model reads that export does not support: a true value is
    # refused. Other families' models ignore these keys (configs copied from one family to
    # another carry them: a Qwen2 config with mlp_bias), and so does export.
    unsupported: tuple[str, ...] = ()
    # Keys the family's model fails without although config.json may leave them out (its
    # config class defaults them to null): refused when absent.
    required: tuple[str, ...] = ()
    # Keys the family's model ignores although the reader would use them (GPT-NeoX has no
    # grouped KV heads whatever num_key_value_heads says): dropped before reading.
    ignores: tuple[str, ...] = ()
    # The soft-caps the family's model applies ("attn", "final"): others keep a key
    # their model ignores (Gemma 3 stores attn_logit_softcapping and never uses it).
    softcaps: tuple[str, ...] = ()
    # Rope types of the family's own model beyond transformers' shared ones (HunYuan's
    # ntk_alpha): another family's model fails on them, and export refuses them there.
    rope_types: tuple[str, ...] = ()
    # Whether global (full-attention) layers go without rotary when the config has a sliding
    # window, the local layers carrying the positions (EXAONE 4's hybrid attention, Cohere 2).
    global_nope: bool = False
    # Whether the model multiplies each query by Llama 4's per-position factor, from its rope
    # dict's llama_4_scaling_beta and original window (Ministral 3; export/query_scale.py).
    query_scale: bool = False
    # Whether `layer_types` may name "conv" layers: LFM2's gated short convolutions, which
    # hold no KV but a recurrent state (export/short_conv.py).
    conv: bool = False
    # Whether `layer_types` may name "linear_attention" layers: Qwen3.5's Gated DeltaNet,
    # which holds no KV but a conv and a recurrent state (export/gated_delta.py).
    delta_net: bool = False
    # Whether its input projections are Qwen3-Next's two, rows grouped per key head
    # (in_proj_qkvz [key head, q|k|v|z], in_proj_ba [key head, b|a]), not Qwen3.5's four.
    delta_grouped: bool = False
    delta_names: DeltaNames = QWEN_DELTA_NAMES
    # OLMo Hybrid's DeltaNet: its gated norm's epsilon, fixed (None: the model's norm
    # epsilon), and the key that doubles beta (linear_allow_neg_eigval: beta in [0, 2]).
    delta_norm_eps: float | None = None
    delta_beta_key: str | None = None
    # The block of the state layers (linear attention) where it differs from `block` (OLMo
    # Hybrid: OLMo 3's post-norm attention layers beside Llama's pre-norm DeltaNet layers).
    state_block: str | None = None
    # Routed experts in place of the MLP on the layers the spec's rule gives (export/moe.py).
    moe: MoeSpec | None = None
    # Whether `layer_types` may name "mamba" layers: Mamba-2 mixers (Granite 4.0-H), which
    # hold no KV but a conv and a recurrent state (export/mamba2.py).
    mamba: bool = False
    # Whether the `mamba` layers are Mamba-1's selective scan (mamba, falcon_mamba:
    # export/mamba1.py), not Mamba-2 mixers.
    selective: bool = False
    # Whether no layer attends (Mamba-2: a bundle without KV). Elsewhere a config without an
    # attention layer is refused: the hybrids' transformers models fail on one (their
    # cache's get_seq_length needs an attention layer).
    attention_free: bool = False
    # Whether each of the model's layers is one sublayer after a norm (Nemotron-H's blocks),
    # which export reads as pre-norm layers of a mixer and the MLP after it
    # (export/layer_groups.py).
    blocks: bool = False
    # Whether q_proj gives each head's query and an output gate (Qwen3-Next's attention:
    # rows [head, query|gate, dim]; the attention's output times sigmoid(gate)).
    attn_gate: bool = False
    # The config key that switches on a sigmoid output gate per head, from its own
    # projection of the layer's input (LFM3's use_attention_gate; names.head_gate).
    head_gate_key: str | None = None
    # Multimodal checkpoints (Gemma 3): the key whose config is the language model's, and
    # the keys the outer config decides instead, with the outer class's default (None: no
    # default, the inner config's value stands).
    nested: str | None = None
    outer: Mapping[str, Any] = field(default_factory=dict)
    # Where such a checkpoint stores the language model: (stored prefix, read as) pairs,
    # and the prefixes of the tensors export leaves out (vision tower, projector).
    renames: tuple[tuple[str, str], ...] = ()
    left_out: tuple[str, ...] = ()
    # Where `nested` and `outer` cannot say how the config class finds its language
    # model's keys: config.json -> those keys (Qwen2-VL: flat Hub configs, either tying).
    unnest: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # The text_config model types such a checkpoint's language model may have (empty: any).
    text_types: tuple[str, ...] = ()
    # What the family's model can be that export does not support (Granite 4's routed
    # experts): config.json as read -> the reason in one line, or None.
    refuse: Callable[[dict[str, Any]], str | None] | None = None
    # Modules (relative to the layer prefix) whose weights are stored [in, out] (GPT-2's
    # Conv1D), not nn.Linear's [out, in]: the checkpoint reads them transposed.
    transposed: tuple[str, ...] = ()
    # The config key that scales each layer's attention scores by a further 1 / (layer + 1)
    # (GPT-2's scale_attn_by_inverse_layer_idx, as Stanford CRFM's Mistral checkpoints use).
    inverse_layer_scale_key: str | None = None
    # Gemma 4: layers may have a head size and KV head count of their own
    # (`per_layer_config`), the last `num_kv_shared_layers` read an earlier layer's KV,
    # `attention_k_eq_v` makes full layers' values their keys' projection, and
    # `hidden_size_per_layer_input` adds per-layer inputs (export/per_layer_input.py).
    per_layer_heads: bool = False
    # Gemma 3n: Gemma 4's KV sharing and per-layer inputs (not its per-layer heads), on
    # `altup_num_inputs` streams (AltUp: predict before each layer, correct after it), a
    # LAuReL branch in each layer, and MLP gates that keep only their values above a
    # gaussian quantile (activation_sparsity_pattern): export/altup.py,
    # export/sparse_gate.py. Its block is "altup".
    altup: bool = False
    v_norm: bool = False  # a per-head RMSNorm without weight on v (Gemma 4)
    # Each layer's output times its stored scalar (Gemma 4's `layer_scalar` buffer).
    layer_scalar: bool = False
    # Attention sinks (gpt-oss): a learned logit per query head (names.sinks) joins each
    # query's softmax denominator, and its share of the weight attends to nothing.
    sinks: bool = False
    # Multi-head latent attention (DeepSeek-V2's MLA, export/latent_attention.py): the
    # cache holds each token's latent and rotated key part, one KV head of
    # qk_rope_head_dim + kv_lora_rank.
    latent: bool = False
    # Whether the family's model reads a BitNet quantization_config (export/bitlinear.py):
    # its projections then BitLinear layers, the activations fake-quantized to int8.
    bitnet: bool = False
    # Whether the family's attention clamps q, k and v to [-clip_qkv, clip_qkv] where the
    # config sets clip_qkv (OLMo 1).
    clip_qkv: bool = False
    # Whether the final norm also normalizes the embedding before the first layer (nanochat).
    embed_norm: bool = False
    # Whether the model's rotate_half is cat(x2, -x1), a rotation by -angle (nanochat).
    # Exported as the standard rotary of q and k whose rotated second halves are negated in
    # their projection: q.k is the same (each is the reflected model's q or k reflected),
    # and so is a weightless q/k norm of it.
    rotary_reflected: bool = False

    def read(self, raw: dict[str, Any]) -> dict[str, Any]:
        """config.json as the family's transformers config class reads it."""
        if self.unnest is not None:
            raw = self.unnest(raw)
        elif self.nested is not None:
            raw = self._language_model_config(raw)
        raw = {k: v for k, v in raw.items() if k not in self.ignores}
        raw = {**self.defaults, **raw}  # only absent keys: a null is the config's own
        return self.legacy(raw) if self.legacy is not None else raw

    def _language_model_config(self, raw: dict[str, Any]) -> dict[str, Any]:
        inner = raw[self.nested]  # a KeyError names the missing key
        if not isinstance(inner, dict):
            got = "null" if inner is None else type(inner).__name__
            raise ValueError(f"{self.nested} must be an object, got {got}")
        inner = dict(inner)
        if self.text_types and inner.get("model_type") not in self.text_types:
            raise ValueError(f"text_config model_type {inner.get('model_type')!r} is not "
                             f"supported; supported: {', '.join(self.text_types)}")
        for key, default in self.outer.items():
            value = raw.get(key, default)
            if value is not None:
                inner[key] = value
        return inner


def _after_max_window_layers(i: int, raw: dict[str, Any]) -> bool:
    return i >= int(raw.get("max_window_layers", 28))


def _nope_layers(i: int, raw: dict[str, Any]) -> bool:
    """SmolLM3: the layers without rotary slide (its `no_rope_layers`, 1 = rope)."""
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = int(raw.get("no_rope_layer_interval", 4))
        return (i + 1) % interval == 0
    return i < len(flags) and not flags[i]


def _every_nth_global(i: int, raw: dict[str, Any]) -> bool:
    return bool((i + 1) % int(raw.get("sliding_window_pattern", 6)))


def _gemma_tanh_gelu(raw: dict[str, Any]) -> dict[str, Any]:
    # GemmaConfig: "gelu" is a legacy value of the official releases meant as the tanh form.
    if raw.get("hidden_act") == "gelu":
        raw = {**raw, "hidden_act": "gelu_pytorch_tanh"}
    return raw


def _phi3_longrope(raw: dict[str, Any]) -> dict[str, Any]:
    # Phi3Config: the rope types "su" and "yarn" of earlier versions are longrope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) in (
                "su", "yarn"):
            raw = {**raw, key: {**params, "rope_type": "longrope", "type": "longrope"}}
    return raw


def _neox_rotary_base(raw: dict[str, Any]) -> dict[str, Any]:
    # GPTNeoXConfig: `rotary_emb_base` is the older name of rope_theta.
    params = rope_params(raw)
    if raw.get("rope_theta") is None and "rope_theta" not in params:
        raw = {**raw, "rope_theta": raw.get("rotary_emb_base", 10000.0)}
    return raw


def _olmo3_ropes(raw: dict[str, Any]) -> dict[str, Any]:
    # Olmo3Config: a rope per layer type. A legacy `rope_scaling` and `rope_theta` go to
    # the global layers only; the local ones keep a default rope on the default base
    # (the class pops rope_theta for the global entry, so the local entry never sees it).
    params = raw.get("rope_parameters") or {}
    full = {"rope_type": "default", **(params.get("full_attention") or {}),
            **(raw.get("rope_scaling") or {})}
    full.setdefault("rope_theta", raw.get("rope_theta", OLMO3_THETA))
    sliding = {"rope_type": "default", "rope_theta": OLMO3_THETA,
               **(params.get("sliding_attention") or {})}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}  # merged: read no more
    return {**rest, "rope_parameters": {"full_attention": full, "sliding_attention": sliding}}


def _gemma3_ropes(raw: dict[str, Any]) -> dict[str, Any]:
    # Gemma3TextConfig: a legacy `rope_scaling` updates the global layers' entry of
    # `rope_parameters` (its keys win, the entry's others stay), never the local layers'.
    scaling = raw.get("rope_scaling")
    if scaling is None:
        return raw
    params = raw.get("rope_parameters") or {}
    full = {"rope_type": "default", **(params.get("full_attention") or {}), **scaling}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}
    return {**rest, "rope_parameters": {**params, "full_attention": full}}


def _mrope_as_default(raw: dict[str, Any]) -> dict[str, Any]:
    # Qwen2VLTextConfig (and 2.5's): the Hub's "mrope" type is the default rope. M-RoPE
    # splits the frequencies into time, height and width sections, each rotated by its own
    # position; a text token's three positions are equal, so on text it is that rope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) == "mrope":
            raw = {**raw, key: {**params, "rope_type": "default"}}
    return raw


def _qwen2_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen2VLConfig and Qwen2_5_VLConfig: a config without `text_config` (the Hub's,
    written before transformers 5) keeps the language model's keys at the top level; with
    one, the model ties the embeddings when either level says so, and generates with the
    outer config's BOS and EOS ids where it has them (else text_config's)."""
    inner = raw.get("text_config")
    if inner is None:
        return raw
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings"))
    ids = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
    return {**inner, **ids, "tie_word_embeddings": tie}


def _gemma4_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma4TextConfig.__post_init__: without `layer_types` every 6th layer attends
    globally; the last layer always does; a config without `per_layer_config` (the Hub's)
    gives the full-attention layers `global_head_dim` (512 unless given) and, with
    attention_k_eq_v, `num_global_key_value_heads`; rope per layer type. Its attention
    scales q.k by 1 (its q/k norms stand in for 1/sqrt(head_dim))."""
    raw = dict(raw)
    count = int(raw["num_hidden_layers"])
    types = list(raw.get("layer_types") or ["sliding_attention" if (i + 1) % 6
                                            else "full_attention" for i in range(count)])
    if types:
        types[-1] = "full_attention"
    raw["layer_types"] = types
    if raw.get("per_layer_config") is None:
        full = {"head_dim": raw.get("global_head_dim") or 512}
        heads = raw.get("num_global_key_value_heads")
        if heads is not None and raw.get("attention_k_eq_v"):
            full["num_key_value_heads"] = heads
        raw["per_layer_config"] = {str(i): full for i, kind in enumerate(types)
                                   if kind == "full_attention"}
    if raw.get("rope_parameters") is None:
        raw["rope_parameters"] = GEMMA4_ROPES
    raw["attention_multiplier"] = 1.0
    if raw.get("use_bidirectional_attention") == "vision":
        raw["use_bidirectional_attention"] = None  # text tokens stay causal
    return raw


def _gemma3n_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma3nTextConfig.__post_init__: without `layer_types` every 5th layer attends
    globally; `intermediate_size` may be one width per layer (read by the checkpoint's
    shapes: the widest stands for all); without `activation_sparsity_pattern` the first
    10 layers of a model of more than 10 keep 5% of their gate; the legacy rope keys as
    Gemma 3's. Its attention scales q.k by 1 (a Hub config's query_pre_attn_scalar is
    never read)."""
    raw = _gemma3_ropes(dict(raw))
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        raw["layer_types"] = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                              for i in range(count)]
    widths = raw["intermediate_size"]
    if isinstance(widths, list):
        if len(widths) != count:
            raise ValueError(f"intermediate_size lists {len(widths)} widths for {count} layers")
        raw["intermediate_size"] = max(widths)
    if raw.get("activation_sparsity_pattern") is None:
        sparse = 10 if count > 10 else 0
        raw["activation_sparsity_pattern"] = [0.95] * sparse + [0.0] * (count - sparse)
    raw["attention_multiplier"] = 1.0
    return raw


def _gemma4_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("enable_moe_block"):
        return ("the mixture-of-experts block (enable_moe_block, Gemma 4 26B-A4B) is not "
                "supported; only the dense Gemma 4 models")
    return None


def _hunyuan_ntk_alpha(raw: dict[str, Any]) -> dict[str, Any]:
    # HunYuanDenseV1RotaryEmbedding: the checkpoints' "dynamic" rope with an `alpha` is a
    # fixed NTK stretch of the base, not transformers' length-dependent dynamic rope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("alpha") and \
                params.get("rope_type", params.get("type")) == "dynamic":
            raw = {**raw, key: {**params, "rope_type": "ntk_alpha", "type": "ntk_alpha"}}
    return raw


def _exaone_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    # ExaoneConfig's attribute_map: the Hub's config.json names these keys its own way, and
    # the alias wins where both are given.
    for alias, key in EXAONE_ALIASES.items():
        if alias in raw:
            raw = {**{k: v for k, v in raw.items() if k != alias}, key: raw[alias]}
    return raw


def _rope_unless_given(rope: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config class that, without rope_parameters (absent or null) nor a legacy
    rope_scaling, takes `rope` whatever a top-level rope_theta says (Ministral3Config's
    yarn rope with Llama 4's query scale, ApertusConfig's and CwmConfig's llama3 rope)."""
    def read(raw: dict[str, Any]) -> dict[str, Any]:
        if raw.get("rope_parameters") is None and not raw.get("rope_scaling"):
            raw = {**raw, "rope_parameters": dict(rope)}
        return raw

    return read


def _granite4_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """GraniteMoeHybridConfig: `layers_block_type` is another name of `layer_types`, whose
    legacy "attention" means full_attention and its "linear_attention" the legacy
    "mamba" (export's name for them; all mamba when absent);
    the dense MLP is `shared_intermediate_size` wide; without `position_embedding_type`
    "rope" no layer rotates."""
    types = raw.get("layer_types") or raw.get("layers_block_type") or \
        ["mamba"] * int(raw["num_hidden_layers"])
    remap = {"attention": "full_attention", "linear_attention": "mamba"}
    raw = {**raw, "layer_types": [remap.get(t, t) for t in types],
           "intermediate_size": raw["shared_intermediate_size"]}
    if raw.get("position_embedding_type") != "rope":
        raw["no_rope_layers"] = [0] * len(types)
    return raw


def _granite4_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("num_local_experts"):
        return (f"routed experts are not supported (num_local_experts="
                f"{raw['num_local_experts']}); only dense models (num_local_experts 0)")
    return None


# NemotronHConfig's hybrid_override_pattern characters -> its block kinds
NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def _nemotron_h_config(raw: dict[str, Any]) -> dict[str, Any]:
    """NemotronHConfig: the blocks are `layers_block_type` (or `layer_types`), else the
    legacy `hybrid_override_pattern`; its older mamba_* names win over the newer ones (its
    __post_init__ pops them). Read under Granite 4.0-H's mamba keys: the mixer's width is
    mamba_num_heads x mamba_head_dim, its projections take `use_bias`, and its dt is
    clamped below at time_step_min only. No layer rotates."""
    kinds = raw.get("layers_block_type") or raw.get("layer_types")
    if kinds is None:
        pattern = raw.get("hybrid_override_pattern")
        kinds = ["linear_attention", "moe", "full_attention", "mlp"] if pattern is None \
            else [NEMOTRON_H_PATTERN[c] for c in pattern]
    return {**raw, "layer_types": list(kinds), "num_hidden_layers": len(kinds),
            "mamba_n_heads": raw["mamba_num_heads"], "mamba_d_head": raw["mamba_head_dim"],
            "mamba_n_groups": raw.get("mamba_n_groups", raw["n_groups"]),
            "mamba_d_state": raw["ssm_state_size"],
            "mamba_d_conv": raw.get("mamba_d_conv", raw["conv_kernel"]),
            "mamba_conv_bias": raw.get("mamba_conv_bias", raw["use_conv_bias"]),
            "mamba_proj_bias": raw["use_bias"],
            "time_step_limit": [raw.get("mamba_dt_min", raw["time_step_min"]), float("inf")],
            "no_rope_layer_interval": 1}  # every layer a NoPE one


def _nemotron_h_unsupported(raw: dict[str, Any]) -> str | None:
    moe = [i for i, kind in enumerate(raw["layer_types"]) if kind == "moe"]
    if moe:
        return (f"mixture-of-experts blocks are not supported (layer_types marks {len(moe)} "
                f"of {len(raw['layer_types'])} as moe); only the dense Nemotron-H models")
    return None


def _mamba2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Mamba2Config: every layer one Mamba-2 mixer after an RMS norm (no MLP, no
    attention), read as Nemotron-H's mixer blocks are: the same checkpoint names
    (backbone.layers.{i}.norm / .mixer) and the same gated RMSNorm, gate first. Its keys
    go to Granite 4.0-H's mamba names; the attention keys it lacks get placeholders that
    no layer reads."""
    count = int(raw["num_hidden_layers"])
    return {**raw, "layer_types": ["linear_attention"] * count,
            "mamba_n_heads": raw["num_heads"], "mamba_d_head": raw["head_dim"],
            "mamba_n_groups": raw["n_groups"], "mamba_d_state": raw["state_size"],
            "mamba_d_conv": raw["conv_kernel"], "mamba_conv_bias": raw["use_conv_bias"],
            "mamba_proj_bias": raw["use_bias"], "num_attention_heads": 1,
            "num_key_value_heads": 1, "intermediate_size": 1,
            "no_rope_layer_interval": 1}  # no layer rotates (none attends)


def _mamba_unsupported(raw: dict[str, Any]) -> str | None:
    # Mamba2Mixer (MambaMixer too) applies hidden_act after its convolution; export's
    # mixers apply SiLU (the Hub's models' and the mamba_ssm kernels' only choice).
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        return f"hidden_act {act!r} is not supported; the mixer's convolution takes silu only"
    return None


def _mamba1_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MambaConfig (FalconMambaConfig): every layer one Mamba-1 mixer after an RMS norm,
    read as Mamba-2's are (_mamba2_config), its own keys kept for export/mamba1.py. The
    mixer is `intermediate_size` wide where config.json has the key (the config class sets
    expand x hidden_size, then the keys it was given over it), else expand x hidden."""
    count = int(raw["num_hidden_layers"])
    inner = raw.get("intermediate_size") or int(raw["expand"]) * int(raw["hidden_size"])
    return {**raw, "layer_types": ["linear_attention"] * count, "mamba_inner": inner,
            "num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 1,
            "no_rope_layer_interval": 1}


def _falcon_mamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """FalconMambaConfig: as MambaConfig, and its mixer RMS-normalizes B, C and dt
    (without weight) at mixer_rms_eps; MambaMixer ignores the key where a config has it."""
    return {**_mamba1_config(raw), "mamba_bc_dt_eps": raw["mixer_rms_eps"]}


def _falcon_h1_config(raw: dict[str, Any]) -> dict[str, Any]:
    """FalconH1Config: every layer is attention and Mamba-2 side by side (export reads
    them as mamba layers that keep KV); the mixer is mamba_d_ssm wide (mamba_expand x
    hidden where null), its out_proj biased by `projectors_bias`, its gated RMSNorm only
    with `mamba_rms_norm` (norm before the gate by `mamba_norm_before_gate`); the logits
    times lm_head_multiplier."""
    heads = int(raw["mamba_n_heads"])
    inner = raw.get("mamba_d_ssm") or int(raw["mamba_expand"]) * int(raw["hidden_size"])
    head_dim = raw["mamba_d_head"]
    norm = None if not raw["mamba_rms_norm"] else \
        "norm_first" if raw["mamba_norm_before_gate"] else "gate_first"
    return {**raw, "layer_types": ["mamba"] * int(raw["num_hidden_layers"]),
            "mamba_d_head": int(inner) // heads if head_dim == "auto" else head_dim,
            "mamba_out_bias": raw["projectors_bias"], "mamba_norm": norm,
            "logit_scale": raw["lm_head_multiplier"]}


def _bamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """BambaConfig: the layers in `attn_layer_indices` attend, the others are Mamba-2; its
    rotary covers half of each head whatever the config says (hard-coded there)."""
    attends = raw.get("attn_layer_indices") or ()
    raw = {**raw, "layer_types": ["full_attention" if i in attends else "mamba"
                                  for i in range(int(raw["num_hidden_layers"]))],
           "partial_rotary_factor": 0.5}
    if isinstance(raw.get("rope_parameters"), dict):
        raw["rope_parameters"] = {**raw["rope_parameters"], "partial_rotary_factor": 0.5}
    return raw


def _lfm2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm2Config: `tie_embedding` and `block_ff_dim` are older names that win; without
    `layer_types`, the layers in `full_attn_idxs` attend (every layer when it is absent)
    and the others convolve. Lfm2MLP's width is `intermediate_size` adjusted as
    `block_auto_adjust_ff_dim` says (2/3 of it, times `block_ffn_dim_multiplier`, rounded
    up to a multiple of `block_multiple_of`)."""
    raw = dict(raw)
    if "tie_embedding" in raw:
        raw["tie_word_embeddings"] = raw["tie_embedding"]
    if "block_ff_dim" in raw:
        raw["intermediate_size"] = raw["block_ff_dim"]
    if raw.get("layer_types") is None:
        count = int(raw["num_hidden_layers"])
        attends = raw.get("full_attn_idxs")
        attends = range(count) if attends is None else attends
        raw["layer_types"] = ["full_attention" if i in attends else "conv" for i in range(count)]
    if raw.get("block_auto_adjust_ff_dim", True):
        size = int(2 * int(raw["intermediate_size"]) / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            size = int(multiplier * size)
            multiple = int(raw.get("block_multiple_of", 256))
            size = multiple * ((size + multiple - 1) // multiple)
        raw["intermediate_size"] = size
    return raw


def _lfm3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm3Config: without rope_parameters, the sliding layers take a default rope on
    10000 and the global ones a proportional rope on 1e6 over half of each head's
    frequencies; without layer_types, layer 2 of every four attends globally, layer 0 of
    every four but the first slides and the others convolve. Unlike Lfm2Config it reads
    none of LFM2's older key names, and its MLP is intermediate_size wide as given."""
    raw = dict(raw)
    if raw.get("rope_parameters") is None:
        raw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                               "partial_rotary_factor": 0.5}}
    if raw.get("layer_types") is None:
        raw["layer_types"] = [
            "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0
            else "conv" for i in range(int(raw["num_hidden_layers"]))]
    return raw


def _lfm3_unsupported(raw: dict[str, Any]) -> str | None:
    # Lfm3Model builds the sliding layers' mask from sliding_window and fails without one.
    if "sliding_attention" in raw["layer_types"] and raw.get("sliding_window") is None:
        return "layer_types has sliding_attention layers but sliding_window is null"
    return None


def _qwen3_5_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3_5TextConfig: without `layer_types`, every `full_attention_interval`-th layer
    (4th by default) attends and the others are Gated DeltaNet."""
    if raw.get("layer_types") is None:
        interval = int(raw.get("full_attention_interval", 4))
        raw = {**raw, "layer_types": [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(int(raw["num_hidden_layers"]))]}
    return raw


def _qwen3_5_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3_5MoeTextConfig: Qwen3.5's layer types; it has no dense MLP (every layer's is
    experts), so the reader's intermediate_size, which no layer uses, is the experts'."""
    return {**_qwen3_5_layers(raw), "intermediate_size": raw["moe_intermediate_size"]}


def _qwen3_5_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("num_experts"):
        return (f"routed experts are not supported in a qwen3_5_text config (num_experts="
                f"{raw['num_experts']}); Qwen3.5's MoE models are model_type qwen3_5_moe_text")
    return _delta_net_unsupported(raw)


def _delta_net_unsupported(raw: dict[str, Any]) -> str | None:
    # Qwen3.5's and Qwen3-Next's DeltaNet convolution takes hidden_act; export's is SiLU.
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: the Gated DeltaNet layers' convolution "
                "takes it, and export's is SiLU (every Qwen3.5 and Qwen3-Next checkpoint's)")
    return None


# LaraMiniConfig's layers without `layer_types`: the released pattern, period five
LARA_MINI_PATTERN = ("linear_attention", "sliding_attention", "linear_attention",
                     "full_attention", "sliding_attention")


def _lara_mini_config(raw: dict[str, Any]) -> dict[str, Any]:
    """LaraMiniConfig: LARA_MINI_PATTERN without `layer_types`; no dense MLP (every layer's
    is experts), so the reader's intermediate_size, which no layer uses, is the experts'."""
    types = raw.get("layer_types") or [LARA_MINI_PATTERN[i % len(LARA_MINI_PATTERN)]
                                       for i in range(int(raw["num_hidden_layers"]))]
    return {**raw, "layer_types": types, "intermediate_size": raw["moe_intermediate_size"]}


def _olmo_hybrid_config(raw: dict[str, Any]) -> dict[str, Any]:
    """OlmoHybridConfig: without `layer_types` every 4th layer attends (the last one where
    none would); the DeltaNet's heads default from the attention's (num_attention_heads,
    key heads of 0.75 hidden / heads, value heads twice as wide)."""
    raw = dict(raw)
    count, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    if raw.get("layer_types") is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(count)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
        raw["layer_types"] = types
    defaults = {"linear_num_key_heads": heads, "linear_num_value_heads": heads}
    for key, value in defaults.items():
        raw[key] = value if raw.get(key) is None else raw[key]
    if raw.get("linear_key_head_dim") is None:
        raw["linear_key_head_dim"] = int(0.75 * int(raw["hidden_size"])
                                         / int(raw["linear_num_key_heads"]))
    if raw.get("linear_value_head_dim") is None:
        raw["linear_value_head_dim"] = 2 * int(raw["linear_key_head_dim"])
    return raw


def _olmo_hybrid_unsupported(raw: dict[str, Any]) -> str | None:
    params = raw.get("rope_parameters") or {}
    if "rope_theta" in params and params["rope_theta"] is None:
        return ("rope_parameters without a rope_theta (OLMo Hybrid's NoPE mode, no rotary "
                "on any layer) is not supported")
    return _delta_net_unsupported(raw)


def _lfm2_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm2VlConfig: its LFM2 language model, tied by the outer `tie_embedding` (the older
    name, which wins) or `tie_word_embeddings`, true by default (_liquid_vl_text)."""
    tie = raw.get("tie_embedding", raw.get("tie_word_embeddings", True))
    return _liquid_vl_text(raw, "lfm2", tie)


def _lfm3_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm3VlConfig: its LFM3 language model, tied by the outer `tie_word_embeddings`,
    true by default (it has no older name; _liquid_vl_text)."""
    return _liquid_vl_text(raw, "lfm3", raw.get("tie_word_embeddings", True))


def _liquid_vl_text(raw: dict[str, Any], text_type: str, tie: Any) -> dict[str, Any]:
    """LFM2-VL's and LFM3-VL's config: the language model is text_config (of `text_type`,
    also where it names no type); the outer config decides the tying (`tie`, whatever
    text_config says) and the EOS/BOS ids where it gives them."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    if inner.get("model_type", text_type) != text_type:
        raise ValueError(f"text_config model_type {inner['model_type']!r} is not supported; "
                         f"supported: {text_type}")
    text = {k: v for k, v in inner.items() if k != "tie_embedding"}
    text["tie_word_embeddings"] = tie
    for key in ("eos_token_id", "bos_token_id"):
        if raw.get(key) is not None:
            text[key] = raw[key]
    return text


def _parallel_if_configured(raw: dict[str, Any]) -> str:
    return "shared" if raw.get("use_parallel_residual") else "pre"


def _gpt2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GPT2Config and GPTBigCodeConfig: their own key names, of which hidden_size,
    num_hidden_layers, num_attention_heads and max_position_embeddings are aliases that
    win (attribute_map); an MLP n_inner wide (4 x n_embd when null); no layer rotates
    (positions are the learned `wpe` table); scale_attn_weights false leaves q.k unscaled;
    GPTBigCode's multi_query keeps one KV head."""
    raw = dict(raw)
    for key, alias in GPT2_ALIASES.items():
        raw[alias] = raw.get(alias, raw[key])
    hidden = int(raw["hidden_size"])
    raw["intermediate_size"] = raw["n_inner"] if raw["n_inner"] is not None else 4 * hidden
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    if not raw["scale_attn_weights"]:
        raw["attention_multiplier"] = 1.0
    if raw.get("model_type") == "gpt_bigcode" and raw["multi_query"]:
        raw["num_key_value_heads"] = 1
    return raw


def _gpt2_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("model_type") == "gpt_bigcode" and not raw["multi_query"]:
        return "multi_query=false (a q/k/v projection interleaved per head) is not supported"
    return None


OLMO3_THETA = 500000.0
GEMMA4_ROPES = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
EXAONE_ALIASES = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                  "activation_function": "hidden_act"}
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                   "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "llama_4_scaling_beta": 0.1}
# Llama's convention: `attention_bias` switches the q/k/v and o biases on together.
ATTENTION_BIAS: dict[str, Any] = {"bias_key": "attention_bias", "o_bias": None}
GEMMA = FamilySpec(
    **ATTENTION_BIAS, norm="rms_plus_one", embed_scale="sqrt_hidden", tie_default=True,
    act_default="gelu_pytorch_tanh", legacy=_gemma_tanh_gelu,
    defaults={"head_dim": 256, "max_position_embeddings": 8192},
    quirks=("embedding x sqrt(hidden)", "(1+w) RMSNorm", "gelu-tanh MLP"),
)
SANDWICH = ("norms before and after attention and MLP", "query_pre_attn_scalar")
GRANITE = FamilySpec(
    **ATTENTION_BIAS, embed_scale="multiplier", unsupported=("mlp_bias",),
    defaults={"attention_multiplier": 1.0},
    quirks=("embedding, attention and residual multipliers", "logits scaling"),
)
GEMMA2 = replace(
    GEMMA, block="sandwich", window="always", sliding=lambda i, raw: i % 2 == 0,
    softcaps=("attn", "final"), legacy=None, act_key="hidden_activation",
    defaults={"head_dim": 256, "max_position_embeddings": 8192, "sliding_window": 4096,
              "query_pre_attn_scalar": 256,
              "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    quirks=(*GEMMA.quirks, *SANDWICH, "attention and final-logit soft-capping"),
)
NEOX_NAMES = TensorNames(
    embed=("gpt_neox.embed_in.weight",), final_norm="gpt_neox.final_layer_norm",
    lm_head=("embed_out", "lm_head"), layer="gpt_neox.layers.{i}.",
    qkv="attention.query_key_value", o="attention.dense",
    gate="", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
OLMO2 = FamilySpec(
    **ATTENTION_BIAS, block="post", qk_norm="full", defaults={"rms_norm_eps": 1e-5},
    quirks=("norms after attention and MLP", "q/k RMSNorm over the whole projection"),
)
# Image-text Qwen (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the language model is stored under
# `model.language_model.` (transformers 5, Qwen3-VL on the Hub) or `model.` (Qwen2-VL and
# Qwen2.5-VL on the Hub, as transformers 5 still saves them), the vision tower and its
# merger under `model.visual.` or `visual.`.
QWEN_VL: dict[str, Any] = {
    "nested": "text_config", "renames": (("model.language_model.", "model."),),
    "left_out": ("visual.", "model.visual."),
}
MROPE_QUIRKS = ("M-RoPE (text positions: plain rotary)",
                "language model of an image-text checkpoint (vision tower left out)")
# A Qwen3 language model without sliding windows; the outer config decides the tying
# (false unless it says otherwise, whatever text_config says) and a "mrope" rope type is
# refused, as Qwen3VLForConditionalGeneration fails to build on one.
QWEN3_VL = FamilySpec(
    **QWEN_VL, **ATTENTION_BIAS, qk_norm="head",
    outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
    defaults={"head_dim": 128, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
              "rope_theta": 500_000.0},
    quirks=("per-head q/k RMSNorm", *MROPE_QUIRKS),
)
# A Qwen2 language model (Qwen2-VL's and Qwen2.5-VL's alike).
QWEN2_VL = FamilySpec(
    **QWEN_VL, qkv_bias=True, window="opt_in", sliding=_after_max_window_layers,
    unnest=_qwen2_vl_text, legacy=_mrope_as_default,
    defaults={"max_position_embeddings": 32768, "sliding_window": 4096,
              "max_window_layers": 80, "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0},
    quirks=("q/k/v biases", *MROPE_QUIRKS),
)
# GLM and GLM-4: fused gate_up, rotary on interleaved pairs of the first half of each head
# (partial_rotary_factor 0.5 unless the config says otherwise), q/k/v biases without an o
# bias, and the config classes' own defaults (head_dim 128, eps 1.5625e-7).
GLM_NAMES = replace(LLAMA_NAMES, gate_up="mlp.gate_up_proj")
GLM = FamilySpec(
    names=GLM_NAMES, bias_key="attention_bias", qkv_bias=True, rope_interleaved=True,
    partial_rotary=True,
    defaults={"head_dim": 128, "rms_norm_eps": 1.5625e-07, "max_position_embeddings": 131072,
              "partial_rotary_factor": 0.5},
    quirks=("fused gate_up weights", "interleaved rotary"),
)
# Mistral with Llama 4's query scale and a yarn rope by default; a window on every layer
# where the config has one (MistralModel's mask; a `layer_types` key only draws a warning).
MINISTRAL3 = FamilySpec(
    window="always", query_scale=True, legacy=_rope_unless_given(MINISTRAL3_ROPE),
    ignores=("layer_types",),
    defaults={"head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5},
    quirks=("query x (1 + beta log(1 + floor(position / original window))), Llama 4's",),
)
APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0}
# Apertus: Llama with per-head q/k RMSNorm and an ungated MLP, down(xielu(up(x))), whose
# xIELU has learned alphas in every layer (export/xielu.py); its norms named for the
# sublayer they precede.
APERTUS = FamilySpec(
    **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate="", input_norm="attention_layernorm",
                                    post_attn_norm="feedforward_layernorm"),
    qk_norm="head", gated_mlp=False, act_default="xielu", legacy=_rope_unless_given(APERTUS_ROPE),
    defaults={"max_position_embeddings": 65536, "rms_norm_eps": 1e-5},
    quirks=("per-head q/k RMSNorm", "xIELU MLP without a gate (learned alphas per layer)"),
)


def _pruned_head(raw: dict[str, Any]) -> str | None:
    # Apertus1p5TextConfig: an LM head of output_vocab_size rows (the multimodal tokens'
    # rows pruned); the bundle's logits are as wide as the vocabulary.
    rows = raw.get("output_vocab_size")
    if rows is not None and rows != raw.get("vocab_size"):
        return (f"output_vocab_size {rows} (an LM head pruned below vocab_size "
                f"{raw.get('vocab_size')}) is not supported")
    return None


CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0,
            "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192}


def _iquestcoder_unsupported(raw: dict[str, Any]) -> str | None:
    # IQuestCoderConfig refuses these (the original code's options no release enables).
    for key in ("clip_qkv", "use_sliding_window"):
        if raw.get(key):
            return f"{key} is not supported (IQuestCoderConfig refuses it too)"
    return None


def _granite_swa_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """GraniteSWAConfig (and GraniteMoeSWAConfig): without layer_types every fourth layer
    from the first attends globally and the others slide; `layer_rope_theta` gives each
    layer its rope's base over the rope's other parameters, 0 for no rotary. Read as one
    rope per layer type (_layer_rope_thetas_unsupported refuses what is not) and
    no_rope_layers."""
    count = int(raw["num_hidden_layers"])
    types = list(raw.get("layer_types") or ["full_attention" if i % 4 == 0 else
                                            "sliding_attention" for i in range(count)])
    raw = {**raw, "layer_types": types}
    thetas = raw.get("layer_rope_theta")
    if thetas is None:
        return raw
    base = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0),
            **rope_params(raw)}
    pairs = list(zip(thetas, types, strict=False))  # lengths: _layer_rope_thetas_unsupported
    ropes = {kind: {**base, "rope_theta": next((float(t) for t, k in pairs if k == kind and t),
                                               base["rope_theta"])}
             for kind in ("full_attention", "sliding_attention")}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}
    return {**rest, "rope_parameters": ropes, "no_rope_layers": [int(bool(t)) for t in thetas]}


def _layer_rope_thetas_unsupported(raw: dict[str, Any]) -> str | None:
    thetas = raw.get("layer_rope_theta")
    if thetas is None:
        return None
    if len(thetas) != len(raw["layer_types"]):
        return f"layer_rope_theta lists {len(thetas)} layers; there are {len(raw['layer_types'])}"
    for kind in ("full_attention", "sliding_attention"):
        bases = {float(t) for t, k in zip(thetas, raw["layer_types"], strict=True)
                 if k == kind and t}
        if len(bases) > 1:
            return (f"layer_rope_theta gives the {kind} layers {len(bases)} rope bases; "
                    "export takes one per layer type")
    if raw.get("sliding_window") is None and len(set(thetas) - {0}) > 1:
        return "layer_rope_theta gives layers their own rope bases but sliding_window is null"
    return None


def _logits_times_scaling(raw: dict[str, Any]) -> dict[str, Any]:
    # HyperCLOVAXForCausalLM multiplies the logits by logits_scaling, where Granite divides.
    rest = {k: v for k, v in raw.items() if k != "logits_scaling"}
    return {**rest, "logit_scale": raw.get("logits_scaling", 1.0)}


IMAGE_TEXT_QUIRK = "language model of an image-text checkpoint (vision tower left out)"
# Qwen3.5 dense: Gated DeltaNet layers (3 of 4 by default) beside Qwen3-Next's gated
# attention (per-head (1+w) q/k RMSNorm, rotary on a quarter of each head); every RMSNorm
# but the DeltaNet's gated one scales by (1+w). Its multi-token-prediction head (`mtp.`)
# is not the causal LM's.
QWEN3_5 = FamilySpec(
    **ATTENTION_BIAS, norm="rms_plus_one", qk_norm="head", partial_rotary=True,
    delta_net=True, attn_gate=True, legacy=_qwen3_5_layers, refuse=_qwen3_5_unsupported,
    left_out=("mtp.", "model.visual."),
    defaults={"head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32},
    quirks=("gated attention (q_proj gives an output gate)", "per-head q/k (1+w) RMSNorm",
            "(1+w) RMSNorm"),
)
# Qwen3.5-MoE (Qwen3.5-35B-A3B and larger): Qwen3.5's layers, each one's MLP routed experts
# beside a shared expert gated by sigmoid(shared_expert_gate(x)), as Qwen2-MoE's; its router
# always renormalizes the top k (it reads no norm_topk_prob).
QWEN_SHARED_EXPERT = MoeNames(shared="mlp.shared_expert.",
                              shared_gate="mlp.shared_expert_gate.weight")
QWEN3_5_MOE = replace(
    QWEN3_5, legacy=_qwen3_5_moe_config, refuse=_delta_net_unsupported,
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, norm_key=None, renormalize=True),
    defaults={**QWEN3_5.defaults, "num_experts": 256, "num_experts_per_tok": 8,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
)
# Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5-MoE's layers, its DeltaNet's input projections
# two whose rows are grouped per key head; experts (norm_topk_prob, true by default) on
# Qwen3-MoE's sparse layers, a dense MLP on the others (mlp_only_layers).
QWEN3_NEXT = replace(
    QWEN3_5, legacy=_qwen3_5_layers, refuse=_delta_net_unsupported, delta_grouped=True,
    left_out=("mtp.",),
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, layers=sparse_layers),
    defaults={**QWEN3_5.defaults, "intermediate_size": 5632, "num_experts": 512,
              "num_experts_per_tok": 10, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
              "decoder_sparse_step": 1},
)
# Lara Mini (Lara-4-Mini): Qwen3-Next's layers with plain RMSNorms (x * w), Qwen3's
# attention (no output gate) sliding on `sliding_attention` layers, its `full_attention`
# layers without rotary; Qwen3.5's DeltaNet projections fused into one `in_proj` (as the
# checkpoints store them and transformers saves them) and its gated norm named out_norm;
# every layer's MLP experts (softmax, norm_topk_prob) beside an ungated shared expert.
LARA_MINI = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="always", global_nope=True, tie_default=True,
    delta_net=True, delta_names=DeltaNames(projections=("in_proj",), norm="out_norm"),
    legacy=_lara_mini_config, refuse=_delta_net_unsupported,
    moe=MoeSpec(names=replace(QWEN_SHARED_EXPERT, shared_gate=None)),
    defaults={"vocab_size": 151_936, "hidden_size": 1024, "num_hidden_layers": 34,
              "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
              "max_position_embeddings": 131_072, "sliding_window": 512, "rms_norm_eps": 1e-6,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_num_key_heads": 8,
              "linear_num_value_heads": 16, "num_experts": 128, "num_experts_per_tok": 4,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
              "norm_topk_prob": True},
    quirks=("per-head q/k RMSNorm", "full-attention layers without rotary"),
)
# OLMo Hybrid (Olmo-Hybrid-7B): OLMo 3's attention layers (norms after the sublayers, q/k
# RMSNorm over the whole projection, no window) beside Llama-style pre-norm Gated DeltaNet
# layers, whose projections are separate (q, k, v, the gate g, b, a), whose gated norm has
# an epsilon of its own (1e-5) and whose beta doubles (linear_allow_neg_eigval).
# As transformers saves it (and loads it, conversion_mapping.py): every layer's norm after
# its mixer (before the MLP in a DeltaNet layer, after the attention in an attention layer)
# is feedforward_layer_norm, a DeltaNet layer's input norm attention_layer_norm.
OLMO_HYBRID_NAMES = replace(LLAMA_NAMES, input_norm="attention_layer_norm",
                            post_attn_norm="feedforward_layer_norm")
OLMO_HYBRID = replace(
    OLMO2, delta_net=True, state_block="pre",
    names=OLMO_HYBRID_NAMES,
    delta_names=DeltaNames(projections=("q_proj", "k_proj", "v_proj", "g_proj", "b_proj",
                                        "a_proj"),
                           conv=("q_conv1d", "k_conv1d", "v_conv1d"), out="o_proj",
                           norm="o_norm"),
    delta_norm_eps=1e-5, delta_beta_key="linear_allow_neg_eigval",
    legacy=_olmo_hybrid_config, refuse=_olmo_hybrid_unsupported, ignores=("head_dim",),
    defaults={"vocab_size": 100_352, "hidden_size": 3840, "intermediate_size": 11_008,
              "num_hidden_layers": 32, "num_attention_heads": 30,
              "max_position_embeddings": 65_536, "rms_norm_eps": 1e-6,
              "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True},
    quirks=("norms after attention and MLP on the attention layers",
            "q/k RMSNorm over the whole projection", "Gated DeltaNet layers (pre-norm)",
            "DeltaNet beta doubled (linear_allow_neg_eigval)"),
)
GEMMA4 = FamilySpec(
    **ATTENTION_BIAS, block="sandwich", qk_norm="head", v_norm=True, layer_scalar=True,
    embed_scale="sqrt_hidden", tie_default=True, act_default="gelu_pytorch_tanh",
    act_key="hidden_activation", window="always", softcaps=("final",),
    rope_types=("proportional",), per_layer_heads=True, legacy=_gemma4_config,
    refuse=_gemma4_unsupported,
    defaults={"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
              "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 512,
              "rms_norm_eps": 1e-6, "vocab_size_per_layer_input": 262_144,
              "hidden_size_per_layer_input": 256, "final_logit_softcapping": None},
    quirks=("embedding x sqrt(hidden)", "gelu-tanh MLP", *SANDWICH[:1],
            "per-head q/k RMSNorm, v RMSNorm without weight", "q.k unscaled",
            "per-layer inputs (a second embedding fed to every layer)",
            "a learned scalar on each layer's output"),
)
# Gemma 3n (E2B, E4B): Gemma 4's attention (per-head q/k RMSNorm, v norm without weight,
# q.k unscaled), per-layer inputs and KV sharing, on AltUp's streams with LAuReL and
# activation sparsity (block "altup"), the final soft-cap.
GEMMA3N = FamilySpec(
    **ATTENTION_BIAS, block="altup", qk_norm="head", v_norm=True, altup=True,
    embed_scale="sqrt_hidden", tie_default=True, act_default="gelu_pytorch_tanh",
    act_key="hidden_activation", window="always", softcaps=("final",),
    legacy=_gemma3n_config,
    defaults={"vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384,
              "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 256, "max_position_embeddings": 32_768, "sliding_window": 512,
              "rms_norm_eps": 1e-6, "vocab_size_per_layer_input": 262_144,
              "hidden_size_per_layer_input": 256, "final_logit_softcapping": 30.0,
              "num_kv_shared_layers": 15, "altup_num_inputs": 4, "altup_active_idx": 0,
              "altup_correct_scale": True, "laurel_rank": 64,
              "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
    quirks=("embedding x sqrt(hidden)", "gelu-tanh MLP",
            "per-head q/k RMSNorm, v RMSNorm without weight", "q.k unscaled",
            "per-layer inputs (a second embedding fed to every layer)",
            "AltUp streams (predicted before each layer, corrected after it)",
            "a LAuReL low-rank branch beside each layer's attention"),
)
# Gemma 4 Unified (gemma-4-12B): Gemma 4's language model without per-layer inputs nor
# experts (its config class has no such keys, and its model reads none that a config.json
# may carry), its own defaults (window 1024, 262,144 positions).
PER_LAYER_INPUT_KEYS = ("hidden_size_per_layer_input", "vocab_size_per_layer_input")
GEMMA4_UNIFIED = replace(
    GEMMA4, ignores=(*PER_LAYER_INPUT_KEYS, "enable_moe_block", "num_experts",
                     "top_k_experts", "moe_intermediate_size"),
    refuse=None,
    defaults={**{k: v for k, v in GEMMA4.defaults.items() if k not in PER_LAYER_INPUT_KEYS},
              "max_position_embeddings": 262_144, "sliding_window": 1024},
    quirks=tuple(q for q in GEMMA4.quirks if not q.startswith("per-layer inputs")),
)
# transformers 5 loads EXAONE 3.0/3.5 as Llama, renaming the Hub's tensors.
EXAONE_NAMES = TensorNames(
    embed=("transformer.wte.weight",), final_norm="transformer.ln_f",
    layer="transformer.h.{i}.", q="attn.attention.q_proj", k="attn.attention.k_proj",
    v="attn.attention.v_proj", o="attn.attention.out_proj", gate="mlp.c_fc_0",
    up="mlp.c_fc_1", down="mlp.c_proj", input_norm="ln_1", post_attn_norm="ln_2",
)
# GraniteMoeHybridConfig's Mamba-2 keys and their defaults (BambaConfig's and
# FalconH1Config's too).
MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                  "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2,
                  "mamba_conv_bias": True, "mamba_proj_bias": False}
# Bamba's and Falcon-H1's names: the MLP is `feed_forward`, its norm `pre_ff_layernorm`.
HYBRID_NAMES = replace(LLAMA_NAMES, final_norm="model.final_layernorm",
                       gate="feed_forward.gate_proj", up="feed_forward.up_proj",
                       down="feed_forward.down_proj", post_attn_norm="pre_ff_layernorm")
# Liquid's LFM2: gated short convolutions between attention layers (export/short_conv.py).
LFM2 = FamilySpec(
    names=replace(LLAMA_NAMES, final_norm="model.embedding_norm", o="self_attn.out_proj",
                  q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm",
                  gate="feed_forward.w1", up="feed_forward.w3", down="feed_forward.w2",
                  input_norm="operator_norm", post_attn_norm="ffn_norm"),
    qk_norm="head", conv=True, tie_default=True, act_key=None, eps_key="norm_eps",
    legacy=_lfm2_config,
    defaults={"norm_eps": 1e-5, "rope_theta": 1_000_000.0,
              "max_position_embeddings": 128_000, "conv_L_cache": 3},
    quirks=("per-head q/k RMSNorm",),
)
# Liquid's LFM3: LFM2's layers (as Qwen3's attention: o_proj, q_norm, k_norm) with sliding
# layers beside the global ones, each kind its own rope; an output gate per head and norms
# after each sublayer, each switched by the config; an MLP of intermediate_size as given.
LFM3_NAMES = replace(LLAMA_NAMES, final_norm="model.embedding_norm", gate="feed_forward.w1",
                     up="feed_forward.w3", down="feed_forward.w2", input_norm="operator_norm",
                     post_attn_norm="post_operator_norm", pre_mlp_norm="ffn_norm",
                     post_mlp_norm="post_ffn_norm")
LFM3 = FamilySpec(
    **ATTENTION_BIAS, names=LFM3_NAMES, block="sandwich", qk_norm="head", conv=True,
    window="always", tie_default=True, act_key=None, eps_key="norm_eps",
    block_from_config=lambda raw: "sandwich" if raw["use_sandwich_norm"] else "pre",
    block_names={"pre": replace(LFM3_NAMES, post_attn_norm="ffn_norm")},
    head_gate_key="use_attention_gate", rope_types=("proportional",), legacy=_lfm3_config,
    refuse=_lfm3_unsupported,
    # Lfm3Config's defaults (LFM3-1.7B's): head_dim is not hidden_size / heads
    defaults={"vocab_size": 128_000, "hidden_size": 2048, "intermediate_size": 7680,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
              "rope_theta": 1_000_000.0, "conv_L_cache": 7, "sliding_window": 256,
              "use_sandwich_norm": True, "use_attention_gate": True},
    quirks=("per-head q/k RMSNorm",),
)
# GPT-2's config keys -> the names the reader reads (which win where both are given).
GPT2_ALIASES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                "n_head": "num_attention_heads", "n_positions": "max_position_embeddings"}
GPT2_NAMES = TensorNames(
    embed=("transformer.wte.weight",), position_embed="transformer.wpe.weight",
    final_norm="transformer.ln_f", layer="transformer.h.{i}.", qkv="attn.c_attn",
    o="attn.c_proj", gate="", up="mlp.c_fc", down="mlp.c_proj", input_norm="ln_1",
    post_attn_norm="ln_2",
)
# GPT-2 and GPTBigCode: LayerNorm with bias, biases on every projection, an ungated gelu
# MLP, learned absolute positions and no rotary. The Hub's GPT-2 checkpoints store the
# base model's tensors without the `transformer.` prefix (h.0.attn.c_attn.weight), later
# saves with it; transformers reads both.
GPT2 = FamilySpec(
    names=GPT2_NAMES, norm="layer", gated_mlp=False, qkv_bias=True, o_bias=True,
    mlp_bias=True, tie_default=True, act_default="gelu_new", act_key="activation_function",
    eps_key="layer_norm_epsilon", legacy=_gpt2_config, refuse=_gpt2_unsupported,
    inverse_layer_scale_key="scale_attn_by_inverse_layer_idx",
    renames=tuple((p, "transformer." + p) for p in ("h.", "wte.", "wpe.", "ln_f.")),
    # keys other families read that GPT2Config has no use for (its own names win)
    ignores=("intermediate_size", "num_key_value_heads", "head_dim", "no_rope_layers",
             "no_rope_layer_interval", "layer_types", "attention_multiplier",
             "query_pre_attn_scalar", "rope_parameters", "rope_scaling"),
    defaults={"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
              "layer_norm_epsilon": 1e-5, "scale_attn_weights": True},
    transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    quirks=("learned absolute position embeddings", "LayerNorm with bias", "gelu MLP",
            "Conv1D weights stored [in, out]"),
)
PHI_NAMES = TensorNames(final_norm="model.final_layernorm", o="self_attn.dense",
                        gate="", up="mlp.fc1", down="mlp.fc2")

def _qwen2_moe_window(i: int, raw: dict[str, Any]) -> bool:
    """Qwen2MoeConfig without layer_types: the even layers below max_window_layers slide."""
    return bool((i + 1) % 2) and i < int(raw.get("max_window_layers", 28))


def _lfm2_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    # Lfm2MoeConfig: `tie_embedding`, the older name, wins; the dense MLP is
    # intermediate_size wide as given (no auto-adjust, unlike LFM2's).
    if "tie_embedding" in raw:
        raw = {**raw, "tie_word_embeddings": raw["tie_embedding"]}
    return raw


# Qwen3-MoE's and OLMoE's configs alias num_experts to num_local_experts, which wins.
EXPERT_ALIASES = ("num_local_experts", "num_experts")
QWEN_MOE_DEFAULTS = {"decoder_sparse_step": 1, "norm_topk_prob": False,
                     "max_position_embeddings": 32768, "sliding_window": 4096}
# Qwen3-MoE: Qwen3 (per-head q/k norms) whose MLPs are routed experts, softmax then top-k.
QWEN3_MOE = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="opt_in",
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, layers=sparse_layers),
    defaults={**QWEN_MOE_DEFAULTS, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 768},
    quirks=("per-head q/k RMSNorm",),
)
# Mellum: Qwen3-MoE's layers, sliding on its `sliding_attention` ones (all full without
# `layer_types`), a rope per layer type (500,000 and 10,000 by default), experts on the
# `sparse` layers of `mlp_layer_types` (all without it), a dense MLP on the `dense` ones.
MELLUM_ROPES = {"full_attention": {"rope_type": "default", "rope_theta": 500_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


def _mellum_config(raw: dict[str, Any]) -> dict[str, Any]:
    count = int(raw["num_hidden_layers"])
    return {**raw, "layer_types": raw.get("layer_types") or ["full_attention"] * count,
            "rope_parameters": raw.get("rope_parameters") or MELLUM_ROPES}


def _mlp_layer_types_sparse(raw: dict[str, Any]) -> tuple[int, ...]:
    """Laguna's and Mellum's `mlp_layer_types`: the `sparse` layers (all without it)."""
    kinds = raw.get("mlp_layer_types") or ["sparse"] * int(raw["num_hidden_layers"])
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


def _per_type_partial_rotary(raw: dict[str, Any]) -> str | None:
    # Laguna's rotary reads a partial_rotary_factor per layer type; export's is one.
    for kind, params in (raw.get("rope_parameters") or {}).items():
        factor = params.get("partial_rotary_factor", 1.0) if isinstance(params, dict) else 1.0
        if factor != 1.0:
            return (f"a partial_rotary_factor per layer type ({kind}: {factor}) is not "
                    "supported; export rotates whole heads")
    return None


MELLUM = replace(
    QWEN3_MOE, window="always", sliding=lambda i, raw: False, legacy=_mellum_config,
    refuse=_per_type_partial_rotary, left_out=("mtp.",),
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, layers=_mlp_layer_types_sparse),
    defaults={"vocab_size": 98_304, "hidden_size": 2304, "intermediate_size": 7168,
              "num_hidden_layers": 28, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 131_072, "sliding_window": 1024,
              "num_local_experts": 64, "num_experts_per_tok": 8,
              "moe_intermediate_size": 896, "norm_topk_prob": True, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "a rope per layer type",
            "dense and sparse layers (mlp_layer_types)"),
)
# Flint: Qwen3-MoE's layers with attention sinks, sliding windows on its
# `sliding_attention` layers (FlintConfig's pattern without `layer_types`), no rotary on its
# full ones; sigmoid routing without a bias (`norm_topk_prob` renormalizes, no epsilon)
# beside an ungated shared expert; the first two layers dense (mlp_only_layers). Its sinks
# are stored as `softmax_offset` (the checkpoints' name, which transformers saves).
def _flint_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """FlintConfig: without `layer_types`, full attention on the first two layers, every
    fourth from the second and the last; without `mlp_only_layers`, [0, 1]."""
    count = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [
        "full_attention" if i < 2 or i % 4 == 1 or i == count - 1 else "sliding_attention"
        for i in range(count)]
    dense = raw.get("mlp_only_layers")
    return {**raw, "layer_types": types, "mlp_only_layers": [0, 1] if dense is None else dense}


FLINT = replace(
    QWEN3_MOE, names=replace(LLAMA_NAMES, sinks="self_attn.softmax_offset"), sinks=True,
    window="always", global_nope=True, legacy=_flint_layers,
    moe=MoeSpec(names=MoeNames(shared="mlp.shared_expert."), routing="sigmoid",
                layers=sparse_layers),
    defaults={"vocab_size": 150_144, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 49, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 262_144, "sliding_window": 513,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
              "num_experts_per_tok": 6, "num_experts": 256, "norm_topk_prob": True,
              "decoder_sparse_step": 1, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "attention sinks (a learned logit per head)",
            "full-attention layers without rotary", "sigmoid routing"),
)
# Qwen1.5/2-MoE: Qwen2 (q/k/v biases) with routed experts beside a shared expert whose
# output is gated by sigmoid(shared_expert_gate(x)).
QWEN2_MOE = FamilySpec(
    bias_key="qkv_bias", qkv_bias=True, window="opt_in", sliding=_qwen2_moe_window,
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, layers=sparse_layers),
    defaults={**QWEN_MOE_DEFAULTS, "num_experts": 60, "num_experts_per_tok": 4,
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "max_window_layers": 28, "num_key_value_heads": 16},
    quirks=("q/k/v biases",),
)
# Mixtral: Mistral (a window on every layer where the config sets one) whose MLPs are 8
# experts, softmax then top 2, always renormalized; the Hub's experts are w1 (gate), w3
# (up) and w2 (down) under block_sparse_moe, transformers 5's modules' under mlp.
MIXTRAL = FamilySpec(
    window="always",
    moe=MoeSpec(names=MoeNames(router=("block_sparse_moe.gate.weight", "mlp.gate.weight"),
                               expert="block_sparse_moe.experts.{j}.", gate="w1", up="w3",
                               down="w2"),
                experts_keys=EXPERT_ALIASES, width_key="intermediate_size", norm_key=None,
                renormalize=True),
    defaults={"max_position_embeddings": 131072, "rope_theta": 1_000_000.0,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "num_local_experts": 8,
              "num_experts_per_tok": 2},
)


def _ernie4_5_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Ernie4_5_MoeConfig: moe_k and moe_num_experts, aliased num_experts_per_tok and
    num_experts (the moe_ names win; 6 and 64 where neither is given); its shared experts
    are one MLP moe_num_shared_experts x moe_intermediate_size wide."""
    def first(keys: tuple[str, str], default: int) -> Any:
        return next((raw[k] for k in keys if k in raw), default)

    shared = int(raw["moe_num_shared_experts"] or 0) * int(raw["moe_intermediate_size"])
    return {**raw, "num_experts_per_tok": first(("moe_k", "num_experts_per_tok"), 6),
            "num_experts": first(("moe_num_experts", "num_experts"), 64),
            "shared_expert_intermediate_size": shared}


# ERNIE-4.5-MoE (ERNIE-4.5-21B-A3B): ERNIE 4.5 (interleaved rotary) with experts on every
# moe_layer_interval-th layer from moe_layer_start_index: softmax, the top k of softmax +
# e_score_correction_bias (which chooses, never weighs), divided by max(sum, moe_norm_min);
# an ungated shared MLP beside them.
ERNIE4_5_MOE = FamilySpec(
    rope_interleaved=True, tie_default=True, unsupported=("use_bias",),
    legacy=_ernie4_5_moe_config,
    moe=MoeSpec(names=MoeNames(expert_bias=("mlp.moe_statics.e_score_correction_bias",
                                            "mlp.gate.moe_statics.e_score_correction_bias"),
                               shared="mlp.shared_experts."),
                routing="softmax_bias", layers=interval_layers, norm_key=None,
                renormalize=True, norm_min_key="moe_norm_min", bias_key=None),
    defaults={"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
              "num_key_value_heads": 4, "moe_intermediate_size": 1536,
              "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
              "moe_layer_end_index": -1, "moe_layer_interval": 1, "moe_norm_min": 1e-12},
    quirks=("interleaved rotary",),
)
# OLMoE: OLMo's q/k RMSNorm over the whole projection in a pre-norm block, 64 experts.
OLMOE = FamilySpec(
    **ATTENTION_BIAS, qk_norm="full", unsupported=("clip_qkv",),
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, width_key="intermediate_size"),
    defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "num_experts": 64,
              "num_experts_per_tok": 8, "norm_topk_prob": False},
    quirks=("q/k RMSNorm over the whole projection",),
)
# Granite 3.x MoE: Granite's multipliers; the top k router logits, then softmax; experts
# stored fused (input_linear [E, 2I, H], gate first; output_linear [E, H, I]).
GRANITE_MOE = FamilySpec(
    **ATTENTION_BIAS, embed_scale="multiplier",
    moe=MoeSpec(names=MoeNames(router=("block_sparse_moe.router.layer.weight",
                                       "block_sparse_moe.router.weight"),
                               expert="block_sparse_moe.experts.{j}.",
                               fused_gate_up=("block_sparse_moe.input_linear.weight",
                                              "block_sparse_moe.experts.gate_up_proj"),
                               fused_down=("block_sparse_moe.output_linear.weight",
                                           "block_sparse_moe.experts.down_proj")),
                routing="topk_softmax", experts_keys=("num_local_experts",),
                width_key="intermediate_size", norm_key=None),
    defaults={"attention_multiplier": 1.0, "rms_norm_eps": 1e-6, "num_local_experts": 8,
              "num_experts_per_tok": 2},
    quirks=("embedding, attention and residual multipliers", "logits scaling"),
)


def _granite_shared_width(raw: dict[str, Any]) -> dict[str, Any]:
    # GraniteMoeSharedConfig: the shared MLP is shared_intermediate_size wide (0: none).
    return {**raw, "shared_expert_intermediate_size": raw["shared_intermediate_size"]}


# Granite MoE Shared: Granite MoE with a gated shared MLP (fused input_linear) beside the
# experts where shared_intermediate_size is not 0.
GRANITE_MOE_SHARED = replace(
    GRANITE_MOE, legacy=_granite_shared_width,
    moe=replace(GRANITE_MOE.moe, names=replace(
        GRANITE_MOE.moe.names, shared="shared_mlp.", shared_gate_up="input_linear",
        shared_down="output_linear")),
    defaults={**GRANITE_MOE.defaults, "shared_intermediate_size": 0},
)
# LFM2-MoE (LFM2-8B-A1B): LFM2's short convolutions and attention, a dense MLP in the first
# num_dense_layers and routed experts after (sigmoid routing, an expert bias that chooses).
LFM2_MOE = replace(
    LFM2, legacy=_lfm2_moe_config, required=("layer_types",),
    moe=MoeSpec(names=MoeNames(router=("feed_forward.gate.weight",),
                               expert="feed_forward.experts.{j}.", gate="w1", up="w3",
                               down="w2",
                               fused_gate_up=("feed_forward.experts.gate_up_proj",),
                               fused_down=("feed_forward.experts.down_proj",),
                               expert_bias=("feed_forward.expert_bias",)),
                routing="sigmoid", layers=after_dense_layers, norm_eps=1e-6),
    defaults={**LFM2.defaults, "num_dense_layers": 2, "num_experts": 32,
              "num_experts_per_tok": 4, "moe_intermediate_size": 1792, "norm_topk_prob": True,
              "use_expert_bias": True, "routed_scaling_factor": 1.0, "intermediate_size": 7168,
              "tie_word_embeddings": True},
)


def _shared_experts(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """DeepSeek-V3's shared experts are one MLP `key` x moe_intermediate_size wide (none
    where the count is 0 or null)."""
    def read(raw: dict[str, Any]) -> dict[str, Any]:
        width = int(raw.get(key) or 0) * int(raw["moe_intermediate_size"])
        return {**raw, "shared_expert_intermediate_size": width}

    return read


def _experts_only(raw: dict[str, Any]) -> dict[str, Any]:
    """Solar Open, Kolibri-1: experts on every layer and no dense MLP, whose
    intermediate_size their config classes drop; the experts' width stands in for it."""
    return {**raw, "intermediate_size": raw["moe_intermediate_size"]}


# DeepSeek-V3's experts ("noaux_tc"): sigmoid scores, the top k of scores +
# e_score_correction_bias within the best topk_group of n_group groups, weighed by the
# scores alone, renormalized (+ 1e-20) where norm_topk_prob, times routed_scaling_factor;
# an ungated shared MLP beside them; a dense MLP on the first first_k_dense_replace layers.
DEEPSEEK_MOE = MoeSpec(
    names=MoeNames(expert_bias=("mlp.gate.e_score_correction_bias",),
                   shared="mlp.shared_experts."),
    routing="sigmoid", experts_keys=("num_local_experts", "n_routed_experts"),
    layers=after_first_k_dense, norm_eps=1e-20, bias_key=None, grouped=True)
DEEPSEEK_MOE_DEFAULTS = {"n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                         "routed_scaling_factor": 1.0, "norm_topk_prob": True}
# GLM-4.5/4.6 (-Air): Cohere's attention as GLM-4.5 configures it (q/k/v biases by
# attention_bias, no o bias; rotary on the first partial_rotary_factor of each head, not
# interleaved; per-head q/k RMSNorm where use_qk_norm) in a pre-norm block, DeepSeek-V3's
# experts. Its multi-token-prediction layers (model.layers.{num_hidden_layers}...,
# num_nextn_predict_layers of them) are not the causal LM's: left out, as transformers does.
GLM4_MOE = FamilySpec(
    bias_key="attention_bias", qkv_bias=False, partial_rotary=True, qk_norm="head",
    qk_norm_key="use_qk_norm", legacy=_shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    defaults={**DEEPSEEK_MOE_DEFAULTS, "partial_rotary_factor": 0.5,
              "intermediate_size": 10944, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "n_routed_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
              "first_k_dense_replace": 1, "num_nextn_predict_layers": 1},
)


def _glm4v_moe_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Glm4vMoeConfig: its text_config, tied where either level says so (pre-v5 saves
    kept tie_word_embeddings inside text_config); M-RoPE is the default rope on text."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict) or inner.get("model_type", "glm4v_moe_text") != \
            "glm4v_moe_text":
        raise ValueError("text_config must be an object of model_type glm4v_moe_text")
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings"))
    return {**inner, "tie_word_embeddings": tie}


# GLM-4.5V: GLM-4.5's language model (no q/k norms; attention_bias true by default) under
# model.language_model., beside its vision tower (model.visual.), left out. Its M-RoPE
# turns each section by the token's time, height or width position, all equal on text.
GLM4V_MOE = replace(
    GLM4_MOE, qk_norm=None, qk_norm_key=None, nested="text_config",
    unnest=_glm4v_moe_text,
    legacy=lambda raw: _shared_experts("n_shared_experts")(_mrope_as_default(raw)),
    renames=(("model.language_model.", "model."),), left_out=("model.visual.", "visual."),
    defaults={**GLM4_MOE.defaults, "vocab_size": 151424, "max_position_embeddings": 65536,
              "attention_bias": True},
    quirks=(*MROPE_QUIRKS[:1], IMAGE_TEXT_QUIRK),
)
# dots.llm1: Qwen3's attention (per-head q/k RMSNorm; a window on the layers from
# max_window_layers where the config has one), DeepSeek-V3's experts.
DOTS1 = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="always", sliding=_after_max_window_layers,
    legacy=_shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    # Dots1Config leaves these null, which its model cannot build with
    required=("n_routed_experts", "num_experts_per_tok", "n_shared_experts"),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "norm_topk_prob": False, "intermediate_size": 10944,
              "moe_intermediate_size": 1408, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-6, "first_k_dense_replace": 0, "sliding_window": 4096,
              "max_window_layers": 62},
    quirks=("per-head q/k RMSNorm",),
)
# EXAONE-MoE: EXAONE 4's attention (per-head q/k RMSNorm; with a window, 3 local layers
# per global one, the global ones without rotary) in a pre-norm block, DeepSeek-V3's
# experts (num_experts, num_shared_experts) on the layers mlp_layer_types marks "sparse".
EXAONE_MOE = FamilySpec(
    qk_norm="head", window="always", sliding=_every_nth_global, global_nope=True,
    legacy=_shared_experts("num_shared_experts"), left_out=("mtp.",),
    moe=replace(DEEPSEEK_MOE, experts_keys=("num_experts",), layers=sparse_mlp_layers,
                names=replace(DEEPSEEK_MOE.names, expert_bias=(
                    "mlp.e_score_correction_bias", "mlp.gate.e_score_correction_bias"))),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
              "intermediate_size": 16384, "max_position_embeddings": 2048,
              "sliding_window": 4096, "sliding_window_pattern": 4, "num_experts": 64,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
              "num_shared_experts": 1, "first_k_dense_replace": 1},
    quirks=("per-head q/k RMSNorm",),
)
# Solar Open: Llama's attention (q/k/v biases by attention_bias, no o bias), experts on
# every layer (its config class has no first_k_dense_replace, nor a dense MLP).
SOLAR_OPEN = FamilySpec(
    bias_key="attention_bias", qkv_bias=False,
    legacy=lambda raw: _experts_only(_shared_experts("n_shared_experts")(raw)),
    moe=replace(DEEPSEEK_MOE, layers=every_layer),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "head_dim": 128,
              "rope_theta": 1_000_000.0, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "n_routed_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1280},
)
# Kolibri-1: EXAONE 4's attention (sliding on four of five layers unless layer_types says
# otherwise; the global ones without rotary) in GLM-4's sandwich of norms (stored under
# the Hub's names, post_attn_norm and post_ffn_norm), experts on every layer: the top k of
# the router's logits + its bias (the Hub's moe.router.expert_bias), weighed by the
# sigmoid of those logits, renormalized where norm_topk_prob (no epsilon, no scaling); an
# ungated shared MLP shared_expert_intermediate_size wide.
KOLIBRI1 = FamilySpec(
    block="sandwich",
    names=replace(LLAMA_NAMES, post_attn_norm="post_attn_norm",
                  pre_mlp_norm="post_attention_layernorm", post_mlp_norm="post_ffn_norm"),
    qk_norm="head", window="always", sliding=lambda i, raw: (i + 1) % 5 != 0,
    global_nope=True, legacy=_experts_only,
    moe=MoeSpec(names=replace(DEEPSEEK_MOE.names, expert_bias=(
        "moe.router.expert_bias", "mlp.gate.e_score_correction_bias")),
                routing="sigmoid", experts_keys=EXPERT_ALIASES, bias_key=None,
                bias_on_logits=True, scaling_key=None),
    defaults={"head_dim": 128, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 262144, "sliding_window": 513,
              "num_key_value_heads": 4, "num_experts": 384, "num_experts_per_tok": 6,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
              "norm_topk_prob": False},
    quirks=("norms before and after attention and MLP", "per-head q/k RMSNorm"),
)


def _gpt_oss_rope(raw: dict[str, Any]) -> dict[str, Any]:
    # GptOssConfig: without rope_parameters (and no legacy rope_scaling) its yarn rope.
    if raw.get("rope_parameters") is None and not raw.get("rope_scaling"):
        raw = {**raw, "rope_parameters": {**GPT_OSS_ROPE, "rope_theta": raw["rope_theta"]}}
    return raw


GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
# gpt-oss (20b, 120b): Llama attention with q/k/v/o biases and a sink logit per head,
# sliding (128) and full layers alternating, a yarn rope; every MLP routed experts: the top
# k of biased router logits, softmax over those k; experts with biases and a clamped
# SwiGLU of interleaved gate/up rows, stored MXFP4 on the Hub.
GPT_OSS = FamilySpec(
    **ATTENTION_BIAS, sinks=True, window="always", sliding=lambda i, raw: bool((i + 1) % 2),
    legacy=_gpt_oss_rope,
    moe=MoeSpec(names=MoeNames(router=("mlp.router.weight",), router_bias="mlp.router.bias",
                               fused_gate_up=("mlp.experts.gate_up_proj",),
                               fused_down=("mlp.experts.down_proj",),
                               gate_up_bias="mlp.experts.gate_up_proj_bias",
                               down_bias="mlp.experts.down_proj_bias",
                               interleaved=True, transposed=True, mxfp4=True),
                routing="topk_softmax", experts_keys=("num_local_experts", "num_experts"),
                width_key="intermediate_size", norm_key=None, clamped_swiglu=True),
    defaults={"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088,
              "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
              "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 150000.0, "num_experts_per_tok": 4, "swiglu_alpha": 1.702,
              "swiglu_limit": 7.0, "attention_bias": True},
    quirks=("q/k/v/o biases", "attention sinks (a learned logit per head)",
            "experts and router with biases"),
)

# Mamba-1 (MambaForCausalLM): Mamba-2's layout (`backbone.`, no MLP), its own mixer.
MAMBA1 = FamilySpec(
    names=replace(LLAMA_NAMES, embed=("model.embeddings.weight", "model.embedding.weight"),
                  final_norm="model.norm_f"),
    eps_key="layer_norm_epsilon", mamba=True, selective=True, blocks=True,
    attention_free=True, legacy=_mamba1_config, refuse=_mamba_unsupported,
    renames=(("backbone.", "model."),),
    # MambaConfig's defaults (a recurrent model has no position limit: export's cap)
    defaults={"state_size": 16, "expand": 2, "conv_kernel": 4, "use_bias": False,
              "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "time_step_rank": "auto",
              "max_position_embeddings": 4096, "tie_word_embeddings": True},
    quirks=("no attention (no KV cache)",),
)


def _minicpm3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM3Config: v_head_dim hidden / heads unless given; its scale_emb, residual
    scale_depth / sqrt(layers) (sqrt(layers) where null: none) and logits divisor
    hidden / dim_model_base (hidden where null) are Granite's embedding and residual
    multipliers and logits scaling."""
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    depth = raw.get("scale_depth")
    depth = math.sqrt(layers) if depth is None else float(depth)
    return {**raw, "v_head_dim": raw.get("v_head_dim") or hidden // int(
                raw["num_attention_heads"]),
            "embedding_multiplier": float(raw["scale_emb"]),
            "residual_multiplier": depth / math.sqrt(layers),
            "logits_scaling": hidden / float(raw.get("dim_model_base") or hidden)}


def _rope_halves_refused(raw: dict[str, Any]) -> str | None:
    # DeepseekV3Attention rotates halves (apply_rotary_pos_emb) with rope_interleave false;
    # the family's flavours rotate interleaved pairs.
    if raw.get("rope_interleave") is False:
        return "rope_interleave=false (rotary on halves) is not supported"
    return None


MLA_QUIRKS = ("multi-head latent attention (one cached KV head: the rotated key part and "
              "the normed latent)",)
# MiniCPM3 (MiniCPM3-4B): Llama layers with DeepSeek-V2's latent attention (rotary on
# halves), MiniCPM's scaled embeddings, residual branches and logits; tied.
MINICPM3 = FamilySpec(
    **ATTENTION_BIAS, latent=True, tie_default=True, embed_scale="multiplier",
    legacy=_minicpm3_config, unsupported=("mlp_bias",),
    defaults={"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400,
              "num_hidden_layers": 62, "num_attention_heads": 40,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "kv_lora_rank": 256,
              "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
              "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256},
    quirks=(*MLA_QUIRKS, "embedding, residual and logits scaling"),
)
# Youtu-LLM: Llama layers (Qwen3's MLP) with DeepSeek-V3's latent attention, rotary on
# interleaved pairs; tied.
YOUTU = FamilySpec(
    **ATTENTION_BIAS, latent=True, tie_default=True, rope_interleaved=True,
    refuse=_rope_halves_refused,
    defaults={"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 32, "num_attention_heads": 16,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "kv_lora_rank": 512,
              "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)

def _deepseek_v2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV2Config: its shared experts one ungated MLP of moe_intermediate_size x
    n_shared_experts; topk_method greedy is group-limited routing over one group."""
    shared = int(raw.get("n_shared_experts") or 0) * int(raw["moe_intermediate_size"])
    raw = {**raw, "shared_expert_intermediate_size": shared}
    if raw.get("topk_method") == "greedy":
        raw = {**raw, "n_group": 1, "topk_group": 1}
    return raw


def _deepseek_v2_unsupported(raw: dict[str, Any]) -> str | None:
    method = raw.get("topk_method")
    if method not in ("greedy", "group_limited_greedy"):
        return (f"topk_method {method!r} is not supported; supported: greedy, "
                "group_limited_greedy")
    if method == "group_limited_greedy" and (raw.get("n_group") is None
                                             or raw.get("topk_group") is None):
        return "topk_method group_limited_greedy needs n_group and topk_group"
    return None


# DeepSeek-V2 (V2-Lite, V2, V2.5): latent attention with DeepSeek's complex rotary (on
# interleaved pairs), dense MLPs on the first `first_k_dense_replace` layers, then routed
# experts (softmax, the top k within the best groups, times routed_scaling_factor; the
# router ignores norm_topk_prob) beside ungated shared experts.
DEEPSEEK_V2 = FamilySpec(
    **ATTENTION_BIAS, latent=True, rope_interleaved=True, legacy=_deepseek_v2_config,
    refuse=_deepseek_v2_unsupported, unsupported=("mlp_bias",),
    required=("num_experts_per_tok",),
    moe=MoeSpec(names=MoeNames(shared="mlp.shared_experts."),
                routing="softmax_group_limited", grouped=True,
                experts_keys=("n_routed_experts", "num_experts"), norm_key=None,
                layers=lambda raw: tuple(range(int(raw.get("first_k_dense_replace") or 0),
                                               int(raw["num_hidden_layers"])))),
    defaults={"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 2048, "kv_lora_rank": 512, "q_lora_rank": 1536,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "n_routed_experts": 64, "n_shared_experts": 2, "moe_intermediate_size": 1407,
              "routed_scaling_factor": 1.0, "topk_method": "greedy"},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)


# DeepSeek-V3 (V3, R1, Moonlight, Kimi-K2): DeepSeek-V2's latent attention (rotary on
# interleaved pairs, yarn's mscale_all_dim in the softmax scale) with DeepSeek-V3's experts
# (DEEPSEEK_MOE: noaux_tc after first_k_dense_replace dense layers). Its
# multi-token-prediction layers (model.layers.{num_hidden_layers}..., num_nextn_predict_layers
# of them) are not the causal LM's: transformers ignores them, export leaves them out.
DEEPSEEK_V3 = FamilySpec(
    **ATTENTION_BIAS, latent=True, rope_interleaved=True, refuse=_rope_halves_refused,
    legacy=_shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 129280, "hidden_size": 7168,
              "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "num_hidden_layers": 61, "num_attention_heads": 128, "n_routed_experts": 256,
              "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
              "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
              "first_k_dense_replace": 3, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)


def _sarvam_mla_config(raw: dict[str, Any]) -> dict[str, Any]:
    """SarvamMLAConfig: DeepseekV3Config read from the remote code's keys too (num_experts,
    num_shared_experts; a `deepseek_yarn` rope_scaling is yarn)."""
    for old, new in (("num_experts", "n_routed_experts"),
                     ("num_shared_experts", "n_shared_experts")):
        if old in raw:
            raw = {**raw, new: raw[old]}
    scaling = raw.get("rope_scaling") or {}
    if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        raw = {k: v for k, v in raw.items() if k != "rope_scaling"}
        raw["rope_parameters"] = {**{k: v for k, v in scaling.items() if k != "type"},
                                  "rope_type": "yarn"}
    return _shared_experts("n_shared_experts")(raw)


# Sarvam (sarvam-105b): DeepSeek-V3 under its own defaults (a dense query, one group).
SARVAM_MLA = replace(
    DEEPSEEK_V3, legacy=_sarvam_mla_config,
    defaults={**DEEPSEEK_V3.defaults, "vocab_size": 262144, "hidden_size": 4096,
              "intermediate_size": 16384, "num_hidden_layers": 32,
              "num_attention_heads": 64, "n_routed_experts": 128, "q_lora_rank": None,
              "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
              "num_nextn_predict_layers": 0},
)


def _glm4_moe_lite_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Glm4MoeLiteConfig: experts where mlp_layer_types says "sparse", by default on every
    layer but the first (first_k_dense_replace, which Hub configs carry, is ignored)."""
    if raw.get("mlp_layer_types") is None:
        layers = int(raw["num_hidden_layers"])
        raw = {**raw, "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1)}
    return _shared_experts("n_shared_experts")(raw)


def _glm4_moe_lite_unsupported(raw: dict[str, Any]) -> str | None:
    # Glm4MoeLiteRotaryEmbedding would rotate fewer dims than qk_rope_head_dim, which its
    # attention cannot apply.
    # (transformers folds a top-level partial_rotary_factor into the rope parameters)
    factor = rope_params(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if factor is not None and float(factor) != 1.0:
        return "partial_rotary_factor other than 1 is not supported"
    return _rope_halves_refused(raw)


# GLM-4.7-Flash: DeepSeek-V3's latent attention and GLM-4.5's experts (DeepSeek-V3's) on
# the layers mlp_layer_types marks "sparse". Its multi-token-prediction layer is left out.
GLM4_MOE_LITE = replace(
    DEEPSEEK_V3, legacy=_glm4_moe_lite_config, refuse=_glm4_moe_lite_unsupported,
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 154880, "hidden_size": 2048,
              "intermediate_size": 10240, "moe_intermediate_size": 1536,
              "num_hidden_layers": 47, "num_attention_heads": 20, "n_routed_experts": 64,
              "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
              "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192,
              "num_experts_per_tok": 4, "max_position_embeddings": 202752,
              "rms_norm_eps": 1e-5, "num_nextn_predict_layers": 1},
)

# model_types close to a supported family that export refuses -> why, in words.
REFUSED_TYPES: dict[str, str] = {
    "deepseek_v32": "DeepSeek-V3.2's sparse attention (an indexer choosing each query's "
                    "keys) is not supported",
    "glm_moe_dsa": "GLM-5's DeepSeek sparse attention (an indexer choosing each query's keys) "
                   "is not supported",
    "kimi_linear": "Kimi Linear's KDA (Kimi delta attention) layers are not supported",
    "axk1": "A.X K1's RMSNorm after the experts (post_mlp_layernorm) is not supported",
    "mistral4": "Mistral 4's position-scaled queries and softmax group routing are not "
                "supported",
}

FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(**ATTENTION_BIAS, unsupported=("mlp_bias",)),
    "mistral": FamilySpec(window="always", defaults={"max_position_embeddings": 131072,
                                                     "sliding_window": 4096}),
    "qwen2": FamilySpec(qkv_bias=True, window="opt_in", sliding=_after_max_window_layers,
                        defaults={"max_position_embeddings": 32768, "sliding_window": 4096},
                        quirks=("q/k/v biases",)),
    "qwen3": FamilySpec(**ATTENTION_BIAS, qk_norm="head", window="opt_in",
                        sliding=_after_max_window_layers,
                        defaults={"head_dim": 128, "max_position_embeddings": 32768,
                                  "sliding_window": 4096},
                        quirks=("per-head q/k RMSNorm",)),
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN2_VL,  # the same language model as Qwen2-VL's
    "qwen3_vl": QWEN3_VL,
    # Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's language model with Qwen3-MoE's
    # experts (on the layers sparse_layers gives, where num_experts is not 0); its router
    # always renormalizes the top k, and the Hub stores each layer's experts fused and
    # transposed ([E, H, 2I], [E, I, H]; save_pretrained writes them untransposed).
    "qwen3_vl_moe": replace(
        QWEN3_VL,
        moe=MoeSpec(names=MoeNames(fused_transposable=True), experts_keys=EXPERT_ALIASES,
                    layers=sparse_layers, norm_key=None, renormalize=True),
        defaults={"max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
                  "rope_theta": 500_000.0, "intermediate_size": 5632,
                  "num_key_value_heads": 16, "decoder_sparse_step": 1, "num_experts": 60,
                  "num_experts_per_tok": 4, "moe_intermediate_size": 1408},
    ),
    "qwen3_5_text": QWEN3_5,
    # Qwen3_5ForConditionalGeneration (the Hub's Qwen3.5-0.8B/2B/4B/9B/27B): its language
    # model, exported alone; the outer config decides the tying (false unless it says
    # otherwise). M-RoPE sections (interleaved) are plain rotary on text positions.
    "qwen3_5": replace(
        QWEN3_5, nested="text_config", text_types=("qwen3_5_text",),
        renames=QWEN_VL["renames"], left_out=(*QWEN_VL["left_out"], "mtp."),
        outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
        quirks=(*QWEN3_5.quirks, *MROPE_QUIRKS),
    ),
    "qwen3_5_moe_text": QWEN3_5_MOE,
    "qwen3_next": QWEN3_NEXT,
    # Qwen3_5MoeForConditionalGeneration (the Hub's Qwen3.5-35B-A3B etc.), as `qwen3_5`.
    "qwen3_5_moe": replace(
        QWEN3_5_MOE, nested="text_config", text_types=("qwen3_5_moe_text",),
        renames=QWEN_VL["renames"], left_out=(*QWEN_VL["left_out"], "mtp."),
        outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
        quirks=(*QWEN3_5.quirks, *MROPE_QUIRKS),
    ),
    "lara_mini": LARA_MINI,
    "gemma": GEMMA,
    "gemma2": GEMMA2,
    # VaultGemma: Gemma 2 without the norms after attention and MLP (pre-norm layers).
    "vaultgemma": replace(
        GEMMA2, block="pre", names=replace(LLAMA_NAMES, post_attn_norm="pre_feedforward_layernorm"),
        quirks=(*GEMMA.quirks, SANDWICH[1], "attention and final-logit soft-capping"),
    ),
    "gemma3_text": replace(
        GEMMA, block="sandwich", qk_norm="head", window="always", sliding=_every_nth_global,
        softcaps=("final",), legacy=_gemma3_ropes, act_key="hidden_activation",
        defaults={"head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
                  "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0,
                  "rope_local_base_freq": 10000.0},
        quirks=(*GEMMA.quirks, *SANDWICH, "per-head q/k (1+w) RMSNorm"),
    ),
    # The image-text checkpoints (gemma-3-4b-it and larger): Gemma3ForConditionalGeneration's
    # language model, exported alone. Their text_config lists only what differs from
    # Gemma3TextConfig's defaults (the 4B's has no head counts nor vocab_size), so all of
    # those are defaults here. The outer config decides the tying (true unless it says
    # otherwise, whatever text_config says) and the EOS ids ([1, 106]). Unlike
    # Gemma3ForCausalLM, the multimodal model applies no final soft-cap.
    "gemma3": replace(
        GEMMA, block="sandwich", qk_norm="head", window="always", sliding=_every_nth_global,
        legacy=_gemma3_ropes, act_key="hidden_activation", nested="text_config",
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                  "model.multi_modal_projector."),
        defaults={"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                  "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
                  "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0,
                  "rope_local_base_freq": 10000.0},
        quirks=(*GEMMA.quirks, *SANDWICH, "per-head q/k (1+w) RMSNorm",
                "language model of an image-text checkpoint (vision tower left out)"),
    ),
    # Gemma 4 (E2B, E4B, 31B): Gemma 3's sandwich without (1+w) norms, per-head q/k
    # RMSNorm and a v norm without weight, q.k unscaled, wider heads on the full-attention
    # layers with a proportional rope, per-layer inputs, KV shared by the last layers,
    # a scalar on each layer's output, the final soft-cap.
    "gemma4_text": GEMMA4,
    # Gemma4ForConditionalGeneration (the Hub's gemma-4-E2B/E4B, -it): its language model,
    # exported alone; the vision and audio towers and their embedders left out. The outer
    # config decides the tying (true unless it says otherwise).
    "gemma4": replace(
        GEMMA4, nested="text_config", text_types=("gemma4_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                  "model.embed_audio."),
        quirks=(*GEMMA4.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Gemma 3n: see GEMMA3N.
    "gemma3n_text": GEMMA3N,
    # Gemma3nForConditionalGeneration (the Hub's gemma-3n-E2B/E4B, -it): its language model,
    # exported alone, as Gemma 4's; the vision and audio towers and their embedders (which
    # embed only the ids from 262144 up, none of them text) left out.
    "gemma3n": replace(
        GEMMA3N, nested="text_config", text_types=("gemma3n_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                  "model.embed_audio."),
        quirks=(*GEMMA3N.quirks, IMAGE_TEXT_QUIRK),
    ),
    "gemma4_unified_text": GEMMA4_UNIFIED,
    # Gemma4UnifiedForConditionalGeneration: its language model, exported alone; the
    # encoder-free vision and audio embedders left out, the tying as gemma4's.
    "gemma4_unified": replace(
        GEMMA4_UNIFIED, nested="text_config", text_types=("gemma4_unified_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_embedder.", "model.embed_vision.", "model.embed_audio."),
        quirks=(*GEMMA4_UNIFIED.quirks, IMAGE_TEXT_QUIRK),
    ),
    "phi3": FamilySpec(
        names=replace(LLAMA_NAMES, qkv="self_attn.qkv_proj", gate_up="mlp.gate_up_proj"),
        window="always", partial_rotary=True, legacy=_phi3_longrope,
        # Phi3Config always has a top-level original_max_position_embeddings (4096 unless
        # given), and it wins over the rope dict's (see rope_from_params).
        defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                  "original_max_position_embeddings": 4096},
        quirks=("fused qkv and gate_up weights",),
    ),
    "smollm3": FamilySpec(**ATTENTION_BIAS, tie_default=True, window="opt_in",
                          sliding=_nope_layers, unsupported=("mlp_bias",),
                          defaults={"rope_theta": 2_000_000.0, "max_position_embeddings": 32768}),
    "granite": GRANITE,
    # Granite SWA (granite-swash): Granite with sliding layers but every fourth, a sink logit
    # per head, and a rope base per layer (0: no rotary).
    "granite_swa": replace(
        GRANITE, sinks=True, window="always", tie_default=True, legacy=_granite_swa_layers,
        refuse=_layer_rope_thetas_unsupported,
        defaults={"attention_multiplier": 1.0, "sliding_window": 128, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 8192, "num_key_value_heads": 4},
        quirks=(*GRANITE.quirks, "attention sinks (a learned logit per head)"),
    ),
    # HyperCLOVA X: Granite's multipliers, its logits times logits_scaling (not divided), and
    # with use_post_norm (the default) a norm after attention and MLP too, before the
    # residual multiplier; attention_multiplier null is 1 / sqrt(head_dim).
    "hyperclovax": FamilySpec(
        **ATTENTION_BIAS, embed_scale="multiplier", unsupported=("mlp_bias",),
        names=replace(LLAMA_NAMES, post_attn_norm="post_norm1",
                      pre_mlp_norm="post_attention_layernorm", post_mlp_norm="post_norm2"),
        block_from_config=lambda raw: "sandwich" if raw["use_post_norm"] else "pre",
        block_names={"pre": LLAMA_NAMES}, legacy=_logits_times_scaling,
        defaults={"use_post_norm": True},
        quirks=("embedding, attention and residual multipliers", "logits scaling"),
    ),
    # nanochat: RMSNorms without weight (the embedding normed too), per-head q/k norms after a
    # rotary turning the other way, an ungated ReLU-squared MLP, the final soft-cap.
    "nanochat": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate="", up="mlp.fc1", down="mlp.fc2"),
        norm="rms_no_weight", gated_mlp=False, qk_norm="head_rotated", embed_norm=True,
        rotary_reflected=True, act_default="relu2", softcaps=("final",),
        defaults={"final_logit_softcapping": 15.0, "rms_norm_eps": 1e-6},
        quirks=("RMSNorm without weight, of the embedding too",
                "per-head q/k norms after rotary", "ReLU-squared MLP without a gate",
                "final-logit soft-capping"),
    ),
    # IQuest-Coder: Llama under its own config class (head_dim 128 unless given).
    "iquestcoder": FamilySpec(
        **ATTENTION_BIAS, unsupported=("mlp_bias",), refuse=_iquestcoder_unsupported,
        defaults={"head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8}),
    # CWM: Llama whose layers slide but every fourth (layer_types), a llama3 rope by default.
    "cwm": FamilySpec(
        window="always", sliding=lambda i, raw: i % 4 != 0, unsupported=("mlp_bias",),
        legacy=_rope_unless_given(CWM_ROPE),
        defaults={"head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8, "sliding_window": 8192}),
    # Jais 2: LayerNorm with bias, an ungated ReLU-squared MLP, biases on every projection
    # (attention_bias and mlp_bias, both true by default).
    "jais2": FamilySpec(
        names=replace(LLAMA_NAMES, gate=""), norm="layer", gated_mlp=False,
        bias_key="attention_bias", qkv_bias=True, o_bias=None, mlp_bias_key="mlp_bias",
        act_default="relu2", eps_key="layer_norm_eps",
        defaults={"layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
                  "attention_bias": True, "mlp_bias": True},
        quirks=("LayerNorm with bias", "ReLU-squared MLP without a gate"),
    ),
    # OLMo 1: LayerNorm without weight or bias (eps 1e-5 whatever the config says), q/k/v
    # clamped where clip_qkv is set.
    "olmo": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_affine", clip_qkv=True, eps_key="layer_norm_eps",
        legacy=lambda raw: {**raw, "layer_norm_eps": 1e-5},  # OlmoLayerNorm's, fixed
        quirks=("LayerNorm without weight or bias",),
    ),
    "olmo2": OLMO2,
    "olmo_hybrid": OLMO_HYBRID,
    # OLMo 2 with sliding windows on three of every four layers, each layer type its rope.
    "olmo3": replace(OLMO2, window="always", sliding=lambda i, raw: (i + 1) % 4 != 0,
                     legacy=_olmo3_ropes,
                     defaults={"rms_norm_eps": 1e-5, "sliding_window": 4096}),
    # Llama with rotary on interleaved pairs; `use_bias` would bias every projection.
    "ernie4_5": FamilySpec(
        rope_interleaved=True, tie_default=True, unsupported=("use_bias",),
        defaults={"head_dim": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 131072},
        quirks=("interleaved rotary",),
    ),
    # Norms after the sublayers (as OLMo 2) and per-head q/k norms (as Qwen3); with a
    # window, 3 local layers per global one, and the global layers have no rotary.
    "exaone4": FamilySpec(
        block="post", qk_norm="head", window="always", sliding=_every_nth_global,
        global_nope=True,
        defaults={"rms_norm_eps": 1e-5, "sliding_window": 4096, "sliding_window_pattern": 4},
        quirks=("norms after attention and MLP", "per-head q/k RMSNorm"),
    ),
    # Llama with a plain (ungated) MLP: down(relu(up(x))^2).
    "arcee": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate=""), gated_mlp=False,
        act_default="relu2", unsupported=("mlp_bias",),
        defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
        quirks=("ReLU-squared MLP without a gate",),
    ),
    # BitNet b1.58: Llama with a gated ReLU-squared MLP and sub-norms before o_proj and
    # down_proj; with a BitNet quantization_config its projections are BitLinear layers
    # (ternary weights, int8 fake-quantized activations: export/bitlinear.py).
    "bitnet": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, attn_sub_norm="self_attn.attn_sub_norm",
                                        mlp_sub_norm="mlp.ffn_sub_norm"),
        act_default="relu2", bitnet=True,
        defaults={"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "num_key_value_heads": 5},
        quirks=("RMSNorm of the attention output and of the MLP's gated product",
                "ReLU-squared gated MLP"),
    ),
    # Llama with per-head q/k RMSNorm of the rotated q and k, and a fixed-alpha NTK rope.
    # Its attention reads head_dim, null in the config class, with no fallback.
    "apertus": APERTUS,
    # Apertus 1.5's language model: Apertus with a larger vocabulary, its LM head maybe
    # pruned to the text tokens (output_vocab_size, refused).
    "apertus1p5_text": replace(APERTUS, refuse=_pruned_head,
                               defaults={**APERTUS.defaults, "vocab_size": 266752}),
    "hunyuan_v1_dense": FamilySpec(
        **ATTENTION_BIAS, qk_norm="head_rotated", legacy=_hunyuan_ntk_alpha,
        names=replace(LLAMA_NAMES, q_norm="self_attn.query_layernorm",
                      k_norm="self_attn.key_layernorm"),
        required=("head_dim",), defaults={"rms_norm_eps": 1e-5}, rope_types=("ntk_alpha",),
        quirks=("per-head q/k RMSNorm after rotary",),
    ),
    "glm": GLM,
    # GLM with norms after attention and MLP too (GLM-4-0414): input_layernorm,
    # post_self_attn_layernorm, post_attention_layernorm (before the MLP), post_mlp_layernorm.
    "glm4": replace(
        GLM, block="sandwich",
        names=replace(GLM_NAMES, post_attn_norm="post_self_attn_layernorm",
                      pre_mlp_norm="post_attention_layernorm",
                      post_mlp_norm="post_mlp_layernorm"),
        quirks=(*GLM.quirks, "norms before and after attention and MLP"),
    ),
    # Llama with interleaved rotary and no o bias; its o_proj is hidden x hidden.
    "helium": FamilySpec(
        bias_key="attention_bias", rope_interleaved=True, unsupported=("mlp_bias",),
        defaults={"head_dim": 128, "rms_norm_eps": 1e-8, "rope_theta": 100000.0,
                  "max_position_embeddings": 4096, "num_key_value_heads": 20},
        quirks=("interleaved rotary",),
    ),
    # Mistral whose layers slide or not as `layer_types` says (all slide without it). Its
    # attention reads head_dim, null in the config class, with no fallback.
    "ministral": FamilySpec(window="always", required=("head_dim",),
                            defaults={"max_position_embeddings": 131072,
                                      "sliding_window": 4096}),
    "ministral3": MINISTRAL3,
    # Mistral3ForConditionalGeneration (Ministral 3 3B/8B/14B on the Hub): its Ministral 3
    # language model, exported alone, stored as Gemma 3's is; the outer config decides the
    # tying (true unless it says otherwise). Its Mistral language models (Mistral Small 3.1,
    # whose text_config is "mistral") are not this family.
    "mistral3": replace(
        MINISTRAL3, nested="text_config", text_types=("ministral3",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                  "model.multi_modal_projector."),
        quirks=(*MINISTRAL3.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Llama under the Hub's own tensor and config key names (EXAONE 3.0 and 3.5).
    "exaone": FamilySpec(
        **ATTENTION_BIAS, names=EXAONE_NAMES, legacy=_exaone_aliases, unsupported=("mlp_bias",),
        defaults={"rope_theta": 500_000.0, "max_position_embeddings": 4096,
                  "num_key_value_heads": 8, "rms_norm_eps": 1e-5},
    ),
    # Llama with q/k/v biases on by default and the o bias on its own key.
    "seed_oss": FamilySpec(
        bias_key="attention_bias", qkv_bias=True, o_bias_key="attention_out_bias",
        unsupported=("mlp_bias",),
        defaults={"head_dim": 128, "max_position_embeddings": 524288},
    ),
    # LayerNorm with bias, biases on every projection (`use_bias`), an ungated gelu MLP,
    # and a window on every layer where the config has one.
    "starcoder2": FamilySpec(
        names=replace(LLAMA_NAMES, gate="", up="mlp.c_fc", down="mlp.c_proj"),
        norm="layer", gated_mlp=False, bias_key="use_bias", qkv_bias=True, o_bias=None,
        mlp_bias=None, tie_default=True, act_default="gelu_pytorch_tanh",
        eps_key="norm_epsilon", window="always",
        defaults={"norm_epsilon": 1e-5, "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias", "gelu MLP"),
    ),
    # LFM2: most layers are gated short convolutions (in_proj to B, C, x; a depthwise causal
    # conv of B*x over conv_L_cache tokens; C times that; out_proj), the rest GQA attention
    # with per-head q/k RMSNorm; the final norm is `embedding_norm`.
    "lfm2": LFM2,
    # Lfm2VlForConditionalGeneration (LFM2-VL 450M/1.6B/3B): its LFM2 language model, the
    # SigLIP 2 tower and projector left out.
    "lfm2_vl": replace(
        LFM2, nested="text_config", unnest=_lfm2_vl_text,
        renames=(("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                  "multi_modal_projector."),
        quirks=(*LFM2.quirks, IMAGE_TEXT_QUIRK),
    ),
    "lfm3": LFM3,
    # Lfm3VlForConditionalGeneration (LFM3-VL): its LFM3 language model, stored as LFM2-VL's;
    # the vision tower and projector left out.
    "lfm3_vl": replace(
        LFM3, nested="text_config", unnest=_lfm3_vl_text,
        renames=(("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                  "multi_modal_projector."),
        quirks=(*LFM3.quirks, IMAGE_TEXT_QUIRK),
    ),
    "phi": FamilySpec(
        names=PHI_NAMES, norm="layer", block="shared", gated_mlp=False, qkv_bias=True,
        o_bias=True, mlp_bias=True, lm_head_bias=True, act_default="gelu_new", partial_rotary=True,
        unsupported=("qk_layernorm",),
        defaults={"layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5},
        quirks=("LayerNorm with bias", "gelu MLP",
                "LM head bias"),
    ),
    "stablelm": FamilySpec(
        norm="layer", bias_key="use_qkv_bias", block_from_config=_parallel_if_configured,
        partial_rotary=True, unsupported=("qk_layernorm",),
        defaults={"layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
                  "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias",),
    ),
    "cohere": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
        rope_interleaved=True, unsupported=("use_qk_norm",),
        defaults={"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "rope_theta": 500000.0,
                  "max_position_embeddings": 8192},
        quirks=("LayerNorm without bias",
                "interleaved rotary", "logit scale"),
    ),
    "qwen3_moe": QWEN3_MOE,
    "qwen2_moe": QWEN2_MOE,
    "flint": FLINT,
    "mellum": MELLUM,
    "olmoe": OLMOE,
    "mixtral": MIXTRAL,
    "ernie4_5_moe": ERNIE4_5_MOE,
    "granitemoe": GRANITE_MOE,
    "granitemoeshared": GRANITE_MOE_SHARED,
    # Granite MoE SWA: Granite MoE Shared with Granite SWA's attention (sinks, windows on
    # all layers but every fourth, a rope base per layer).
    "granitemoe_swa": replace(
        GRANITE_MOE_SHARED, sinks=True, window="always",
        legacy=lambda raw: _granite_swa_layers(_granite_shared_width(raw)),
        refuse=_layer_rope_thetas_unsupported,
        defaults={**GRANITE_MOE_SHARED.defaults, "sliding_window": 128},
        quirks=(*GRANITE_MOE.quirks, "attention sinks (a learned logit per head)"),
    ),
    "lfm2_moe": LFM2_MOE,
    "gpt_oss": GPT_OSS,
    "glm4_moe": GLM4_MOE,
    "dots1": DOTS1,
    "exaone_moe": EXAONE_MOE,
    "solar_open": SOLAR_OPEN,
    "kolibri1": KOLIBRI1,
    "glm4v_moe": GLM4V_MOE,
    # Granite 4.0 dense (granite-4.0-micro, the -H models' Mamba-2 layers among attention
    # ones): Granite's multipliers, a gated MLP of fused weights (`shared_mlp`), and
    # rotary only with position_embedding_type "rope".
    "granitemoehybrid": FamilySpec(
        names=replace(LLAMA_NAMES, gate_up="shared_mlp.input_linear",
                      down="shared_mlp.output_linear"),
        **ATTENTION_BIAS, embed_scale="multiplier", legacy=_granite4_layers,
        refuse=_granite4_unsupported, mamba=True,
        defaults={"attention_multiplier": 1.0, "num_local_experts": 8,
                  "shared_intermediate_size": 1024, **MAMBA_DEFAULTS},
        quirks=("embedding, attention and residual multipliers", "logits scaling",
                "fused gate_up weights"),
    ),
    # Bamba: Mamba-2 layers, and attention ones (rotary on half of each head) where
    # attn_layer_indices says, each followed by a gated MLP.
    "bamba": FamilySpec(
        names=HYBRID_NAMES, bias_key="attention_bias", o_bias=None, partial_rotary=True,
        mamba=True, legacy=_bamba_config, unsupported=("mlp_bias",),
        defaults={"num_key_value_heads": 8, "max_position_embeddings": 262144,
                  "rms_norm_eps": 1e-5, **MAMBA_DEFAULTS},
    ),
    # Falcon-H1: attention and a Mamba-2 mixer side by side on each layer's input norm
    # (each keeps KV and states), muP multipliers on both and on the MLP.
    "falcon_h1": FamilySpec(
        names=HYBRID_NAMES, block="hybrid", bias_key="attention_bias", o_bias=None,
        embed_scale="multiplier", mamba=True, legacy=_falcon_h1_config, unsupported=("mlp_bias",),
        defaults={"num_key_value_heads": 8, "max_position_embeddings": 8192,
                  "rms_norm_eps": 1e-5, **MAMBA_DEFAULTS, "mamba_d_ssm": 1024,
                  "mamba_norm_before_gate": True,
                  "mamba_rms_norm": False, "projectors_bias": False,
                  "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0},
        quirks=("attention and Mamba-2 side by side in every layer", "muP multipliers"),
    ),
    # Nemotron-H (Nemotron Nano 9B v2, Nemotron-H 4B/8B): blocks of one Mamba-2 mixer,
    # attention (without rotary) or ReLU-squared MLP each, read as pre-norm layers of a mixer
    # and the MLP after it (export/layer_groups.py).
    "nemotron_h": FamilySpec(
        names=replace(LLAMA_NAMES, embed=("model.embeddings.weight",), final_norm="model.norm_f",
                      gate="", up="mlp.up_proj", down="mlp.down_proj"),
        gated_mlp=False, act_default="relu2", act_key="mlp_hidden_act",
        eps_key="layer_norm_epsilon", mamba=True, blocks=True, legacy=_nemotron_h_config,
        refuse=_nemotron_h_unsupported, unsupported=("mlp_bias",),
        renames=(("backbone.", "model."),),
        defaults={"head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 4096,
                  "intermediate_size": 21504, "layer_norm_epsilon": 1e-5,
                  "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
                  "ssm_state_size": 128, "conv_kernel": 4, "use_conv_bias": True,
                  "use_bias": False, "time_step_min": 0.001},
        quirks=("blocks of one Mamba-2 mixer, attention or MLP, each after its own norm",
                "ReLU-squared MLP without a gate"),
    ),
    # Mamba-2 (Mamba2ForCausalLM: mamba-codestral, the state-spaces mamba2 models): every
    # layer one Mamba-2 mixer after an RMS norm, nothing attends, so the bundle has no KV
    # (export/layer_groups.py reads the layers as Nemotron-H's mixer blocks).
    "mamba2": FamilySpec(
        names=replace(LLAMA_NAMES, embed=("model.embeddings.weight", "model.embedding.weight"),
                      final_norm="model.norm_f"),
        eps_key="layer_norm_epsilon", mamba=True, blocks=True, attention_free=True,
        legacy=_mamba2_config, refuse=_mamba_unsupported, renames=(("backbone.", "model."),),
        # Mamba2Config's defaults; a recurrent model has no position limit, so a bundle's
        # context defaults to export's cap
        defaults={"num_heads": 128, "head_dim": 64, "n_groups": 8, "state_size": 128,
                  "conv_kernel": 4, "expand": 2, "use_bias": False, "use_conv_bias": True,
                  "layer_norm_epsilon": 1e-5, "max_position_embeddings": 4096,
                  "tie_word_embeddings": False},
        quirks=("no attention (no KV cache)",),
    ),
    # Mamba (Mamba-1, state-spaces/mamba-*-hf) and Falcon-Mamba 7B, whose mixer RMS-norms
    # B, C and dt without weight: every layer one selective-scan mixer after an RMS norm,
    # nothing attends (export/mamba1.py, on Mamba-2's Scan body).
    "mamba": MAMBA1,
    "falcon_mamba": replace(MAMBA1, legacy=_falcon_mamba_config,
                            defaults={**MAMBA1.defaults, "mixer_rms_eps": 1e-6},
                            quirks=(*MAMBA1.quirks, "B, C and dt RMS-normed without weight")),
    # LayerNorm1P (1+w, with bias) everywhere, an ungated ReLU-squared MLP, rotary on half
    # of each head unless partial_rotary_factor says otherwise.
    "nemotron": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate=""), norm="layer_plus_one",
        gated_mlp=False, act_default="relu2", eps_key="norm_eps", partial_rotary=True,
        unsupported=("mlp_bias",),
        defaults={"norm_eps": 1e-5, "partial_rotary_factor": 0.5,
                  "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias scaling by (1+w)", "ReLU-squared MLP without a gate"),
    ),
    # Cohere with sliding layers (3 of 4 unless layer_types says otherwise); only they
    # rotate, the global layers go without rope. Its model fails without a window (the
    # sliding mask is built whatever the layers).
    "cohere2": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
        rope_interleaved=True, window="always", sliding=_every_nth_global, global_nope=True,
        required=("sliding_window",),
        defaults={"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "sliding_window": 4096,
                  "sliding_window_pattern": 4, "max_position_embeddings": 8192},
        quirks=("LayerNorm without bias", "interleaved rotary", "logit scale"),
    ),
    "gpt_neox": FamilySpec(
        names=NEOX_NAMES, norm="layer", block="parallel", gated_mlp=False,
        qkv_interleaved=True, bias_key="attention_bias", qkv_bias=True, o_bias=None,
        mlp_bias=True, act_default="gelu", partial_rotary=True, legacy=_neox_rotary_base,
        ignores=("num_key_value_heads",),  # its fused qkv is always 3 x hidden
        defaults={"layer_norm_eps": 1e-5, "rotary_pct": 0.25},
        block_from_config=lambda raw: "parallel" if raw.get("use_parallel_residual", True)
        else "pre",
        quirks=("LayerNorm with bias", "gelu MLP",
                "fused q/k/v interleaved per head"),
    ),
    "gpt2": GPT2,
    "minicpm3": MINICPM3,
    "deepseek_v2": DEEPSEEK_V2,
    "deepseek_v3": DEEPSEEK_V3,
    "sarvam_mla": SARVAM_MLA,
    "glm4_moe_lite": GLM4_MOE_LITE,
    "youtu": YOUTU,
    # GPT-2 with nn.Linear weights, a tanh gelu by default and multi-query attention (one
    # KV head: c_attn is [q (n_embd), k (head_dim), v (head_dim)]).
    "gpt_bigcode": replace(
        GPT2, act_default="gelu_pytorch_tanh", transposed=(), inverse_layer_scale_key=None,
        defaults={**GPT2.defaults, "multi_query": True},
        quirks=("learned absolute position embeddings", "LayerNorm with bias", "gelu MLP",
                "multi-query attention"),
    ),
}
