"""What a family is: `FamilySpec`, the switches the graph builder understands, and the
tensor names (`TensorNames`, `DeltaNames`) a family's checkpoints store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeprefill.export.config_checks import check_objects, check_sizes
from edgeprefill.export.context_cap import ContextCap
from edgeprefill.export.experts import (
    MoaNames,
    MoeSpec,
)


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
    # a norm of the embedding before the first layer (BLOOM's word_embeddings_layernorm)
    embed_norm: str | None = None
    # OPT-350m's projections between a narrower embedding (word_embed_proj_dim) and the
    # layers' width: after the embedding, and before the LM head
    project_in: str = "model.decoder.project_in"
    project_out: str = "model.decoder.project_out"
    # ModernBERT decoder's prediction head before the LM head: dense, activation, norm
    head_dense: str = "lm_head.dense"
    head_norm: str = "lm_head.norm"
    input_norm: str = "input_layernorm"
    post_attn_norm: str = "post_attention_layernorm"
    pre_mlp_norm: str = "pre_feedforward_layernorm"
    post_mlp_norm: str = "post_feedforward_layernorm"
    # LFM3's output gate per head (hidden -> heads), which the Hub's checkpoints call
    # gate_proj and transformers renames g_proj when it loads them
    head_gate: tuple[str, ...] = ("self_attn.g_proj", "self_attn.gate_proj")
    head_gate_bias: str = "self_attn.gate_bias"  # Beam's, one per head (channel_gate)
    # The output gate's own projection where FamilySpec.attn_gate's gate is not q_proj's
    # rows (AFMoE's self_attn.gate_proj, hidden -> heads * head_dim, without bias); None: it is
    attn_gate: str | None = None
    act: str = "mlp.act_fn."  # an activation with weights of its own (Apertus's xIELU)
    mamba: str = "mamba."  # a Mamba-2 layer's mixer module (in_proj, conv1d, norm, ...)
    lru: str = "temporal_block."  # RecurrentGemma's recurrent block (linear_x, rg_lru, ...)
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
    # A bias added after the attention's output projection in the layers whose checkpoint
    # has it (GPT-NeoX Japanese: the last layer's `attention.dense_bias`); None: no such bias
    o_extra_bias: str | None = None


LLAMA_NAMES = TensorNames()

# A language model transformers 5 saved alone after loading it from an image-text
# checkpoint (AutoModelForCausalLM) keeps that checkpoint's names: renames a text family
# takes for it (Qwen3.5's), which a wrapper's own renames replace (wrapped.wrappable).
SAVED_ALONE = (("model.language_model.", "model."),)


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
#   postln     x = n1(x + attn(x)); x = n2(x + mlp(x))                   (OPT-350m, GPT-1)
#   altup      Gemma 3n: the sandwich on AltUp's active stream, with LAuReL (altup.py)
#   rwkv       x += time_mix(n1(x)); x += channel_mix(n2(x)), both reading the token before
#              (RWKV-4: rwkv.py)
#   scaled     x = s1(attn(n1(x)), x); x = s2(mlp(n2(x)), x), each add s(y, x) =
#              (y + b) * a + (x + c) * d per channel, the layer's own (ZAYA)
#   shortcut   two "pre" layers per model layer (LongCat-Flash): the experts read the first
#              one's MLP input, their output added with the second one's MLP
#   normed     h = n1(x); x = a1 h + b1 attn(h); h = n2(x); x = a2 h + b2 mlp(h): the
#              residual is the normed stream, each side times the layer type's factor
#              (MiniMax: ModelConfig.residual_factors)
#   hyper      M streams S; h = mix_a(S); S += post_a x attn(n1(h)); h = mix_m(S);
#              S += post_m x mlp(n2(h)); a head mixes S for the final norm (Hy4's
#              hyper-connections: hyper_connections.py)
#   inkling    x += c1(attn(n1(x))); x += c2(mlp(n2(x))), c1 and c2 residual short
#              convolutions over time (Inkling: inkling.py)
BLOCKS = ("pre", "sandwich", "post", "parallel", "shared", "hybrid", "altup", "postln",
          "rwkv", "scaled", "shortcut", "normed", "hyper", "inkling")


@dataclass(frozen=True)
class FamilySpec:
    names: TensorNames = LLAMA_NAMES
    norm: str = "rms"  # one of NORMS
    # The norm where config.json picks it (Cohere 2 MoE: RMSNorm where rms_norm_eps is set,
    # else LayerNorm without bias): config -> one of NORMS.
    norm_from_config: Callable[[dict[str, Any]], str] | None = None
    block: str = "pre"  # one of BLOCKS
    gated_mlp: bool = True  # act(gate) * up, else act(fc1)
    qkv_bias: bool = False  # q/k/v biases when config.json has no `bias_key`
    bias_key: str | None = None  # the config key that switches q/k/v biases on
    o_bias: bool | None = False  # None: the same as the q/k/v biases
    o_bias_key: str | None = None  # a key of its own for the o bias (Seed-OSS), o_bias unset
    mlp_bias: bool | None = False  # None: the same as the q/k/v biases (StarCoder2)
    mlp_bias_key: str | None = None  # a key of its own for the MLP biases (Jais 2), mlp_bias unset
    qkv_interleaved: bool = False  # fused qkv rows ordered [head, q|k|v, dim] (GPT-NeoX)
    # CodeGen: fused qkv rows ordered [shard, q|v|k, hidden / shards] over this many
    # model-parallel shards (its mp_num, 4); 0: not so
    qkv_shards: int = 0
    # The fused qkv's row layout where config.json decides it (Falcon): "heads" as GPT-NeoX's
    # [head, q|k|v, dim], "groups" [KV head, its queries|k|v, dim]; None: [q|k|v] (or the
    # spec's own layout above).
    qkv_layout_from_config: Callable[[dict[str, Any]], str | None] | None = None
    rope_interleaved: bool = False  # rotary pairs are dims (2i, 2i+1), not (i, i + D/2)
    lm_head_bias: bool = False
    lm_head_bias_key: str | None = None  # a key that switches the LM head's bias on (PhiMoE)
    # None, "head" (per head, before rotary), "head_rotated" (per head, of the rotated q/k:
    # HunYuan), "full" (the whole q/k projection), "l2" (Llama 4's: per head, without
    # weight, on the layers with rotary only; of the rotated q/k in transformers, which is
    # the rotation of the normed q/k: rotary keeps each head's length), "weightless"
    # (Muse Glimmer's: per head, without weight, before rotary, on every layer) or
    # "head_affine" (Chameleon's: each head LayerNorm-ed before rotary, epsilon 1e-5
    # whatever the config says, then times its own weight plus its own bias, both stored
    # [heads, D]: export/head_affine_norm.py)
    qk_norm: str | None = None
    # The config key that switches those norms on; None: always there (GLM-4.5's use_qk_norm)
    qk_norm_key: str | None = None
    # The q/k norms' kind where config.json picks it (Molmo 2's qk_norm_type: "qwen3" per
    # head, "olmo" the whole projection): config -> one of qk_norm's kinds.
    qk_norm_from_config: Callable[[dict[str, Any]], str | None] | None = None
    # None, "sqrt_hidden" (Gemma), "sqrt_hidden_bf16" (RecurrentGemma's, rounded to
    # bfloat16) or "multiplier" (Granite)
    embed_scale: str | None = None
    embed_scale_key: str | None = None  # the key that switches it on (XGLM's scale_embedding)
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
    # Rows of the position table before position 0's (OPT's, BioGPT's and XGLM's offset 2).
    position_offset: int = 0
    # Whose fixed sinusoidal position table the positions are, computed at export (no
    # tensor of the checkpoint; export/sinusoids.py): "xglm" (sin | cos of each position,
    # the row of pad_token_id zeroed) or "ctrl" (sin | cos at CTRL's frequencies); None:
    # names.position_embed's stored table, if any.
    sinusoidal_positions: str | None = None
    # Whether the last layer's output is normed before the LM head, from config.json (OPT:
    # only its pre-norm layers are followed by a final norm); None: always.
    final_norm_from_config: Callable[[dict[str, Any]], bool] | None = None
    # The key of an embedding width of its own (OPT's word_embed_proj_dim): where it
    # differs from hidden_size, names.project_in and project_out map between them.
    embed_width_key: str | None = None
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
    # Whether a layer type whose `rope_parameters` entry is null goes without rotary (Cohere
    # Compass's NoPE layers: its model reads a rope dict per layer type, null for none).
    nope_types: bool = False
    # Whether the model multiplies each query by Llama 4's per-position factor, from its rope
    # dict's llama_4_scaling_beta and original window (Ministral 3; export/query_scale.py).
    query_scale: bool = False
    # Whether the model multiplies its NoPE layers' queries by a factor of the position
    # where attn_temperature_tuning is on (Llama 4; export/query_scale.py).
    temperature_tuning: bool = False
    # Whether the model multiplies its NoPE layers' queries by Beam's scalable-softmax
    # factor of the position (export/query_scale.py).
    scalable_softmax: bool = False
    # Beam's depth-scaled residual adds (a `sandwich` block): the n-th add of the stack is
    # x * sqrt((n - 1) / n) + sublayer / sqrt(n), n = 2 (layer + 1) for the attention's
    # and one more for the MLP's.
    depth_scaled_residual: bool = False
    # Whether `layer_types` may name "chunked_attention" layers (Llama 4's rope layers: a
    # token attends within its attention_chunk_size block only). Within the first block
    # that is causal attention: export caps the bundle's context there (context_cap).
    chunked_attention: bool = False
    # The longest context a bundle computes as the model does, where shorter than its
    # positions, with the reason (export/context_cap.py: Llama 4's chunk, PhiMoE's longrope
    # window): config.json as read -> the cap, or None.
    context_cap: Callable[[dict[str, Any]], ContextCap | None] | None = None
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
    # Whether the linear_attention layers are Kimi's KDA (export/kimi_delta.py): the
    # delta rule with a decay per key channel, low-rank gates and a sigmoid-gated norm.
    kda: bool = False
    # Whether KDA's decay and output gate are full-rank projections (Bailing's f_proj and
    # g_proj, its decay cast to the model's dtype) rather than Kimi's low-rank pairs.
    kda_full_rank: bool = False
    # Whether the latent attention's output is gated per head: sigmoid(g_proj(x)) times
    # each head's values before o_proj (Bailing's MLA; names.head_gate).
    latent_head_gate: bool = False
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
    # Whether `layer_types` may name "rg_lru" layers: RecurrentGemma's recurrent blocks, which
    # hold no KV but a conv and a recurrent state (export/rg_lru.py).
    rg_lru: bool = False
    # Whether `layer_types` may name "rwkv" layers: RWKV-4's blocks (a time mix and a
    # channel mix, each reading the token before), which hold no KV but the token-shift
    # inputs and the WKV numerator, denominator and their exponent (export/rwkv.py).
    rwkv: bool = False
    # Whether `layer_types` may name "linear_attention" layers that are MiniMax's lightning
    # attention (linear attention with a fixed decay per head), which hold no KV but a
    # float32 [heads, head_dim, head_dim] state (export/lightning.py).
    lightning: bool = False
    # Whether `layer_types` may name "mlstm" layers: xLSTM's mLSTM cells (a matrix memory
    # with exponential input and forget gates), which hold no KV but that memory, its
    # normalizer and its stabilizer (export/mlstm.py).
    mlstm: bool = False
    # Whether shared transformer blocks run before the mixers of the `hybrid` layers
    # (Zamba2: export/shared_block.py); every layer is a Mamba-2 mixer without an MLP.
    shared_block: bool = False
    # Whether no layer attends (Mamba-2: a bundle without KV). Elsewhere a config without an
    # attention layer is refused: the hybrids' transformers models fail on one (their
    # cache's get_seq_length needs an attention layer).
    attention_free: bool = False
    # Whether each of the model's layers is one sublayer after a norm (Nemotron-H's blocks),
    # which export reads as pre-norm layers of a mixer and the MLP after it
    # (export/layer_groups.py).
    blocks: bool = False
    # Whether q_proj gives each head's query and an output gate (Qwen3-Next's attention:
    # rows [head, query|gate, dim]; the attention's output times sigmoid(gate)), or where
    # names.attn_gate is set, that projection gives the gate (AFMoE).
    attn_gate: bool = False
    # The config key that switches on a sigmoid output gate per head, from its own
    # projection of the layer's input (LFM3's use_attention_gate; names.head_gate).
    head_gate_key: str | None = None
    # Beam's output gate, always on: sigmoid per channel, its own projection of the layer's
    # normed input (names.head_gate, [H*D, hidden]) plus a bias per head
    # (names.head_gate_bias), the attention's output times it before o_proj.
    channel_gate: bool = False
    # Laguna's output gate, always on: softplus (not sigmoid) of its own projection of the
    # layer's normed input (names.head_gate), one per head broadcast over head_dim, or one
    # per channel where config.json's `gating` is neither true nor "per-head" (as
    # LagunaAttention reads it); no bias.
    softplus_gate: bool = False
    # Step 3.7's output gate, always on: Laguna's (its own projection, per head or per
    # channel by `gating`) through sigmoid, not softplus.
    sigmoid_gate: bool = False
    # A clamped SwiGLU (export/swiglu_clamps.py): "after" the activation, per layer (Step
    # 3.7's swiglu_limits, swiglu_limits_shared), or "before" it, on the routed experts
    # (Hy4's swiglu_limit); None: none.
    swiglu_clamps: str | None = None
    # Multimodal checkpoints (Gemma 3): the key whose config is the language model's, and
    # the keys the outer config decides instead, with the outer class's default (None: no
    # default, the inner config's value stands).
    nested: str | None = None
    outer: Mapping[str, Any] = field(default_factory=dict)
    # Where such a checkpoint stores the language model: (stored prefix, read as) pairs,
    # and the prefixes of the tensors export leaves out (vision tower, projector).
    renames: tuple[tuple[str, str], ...] = ()
    left_out: tuple[str, ...] = ()
    # Renames inside a name, as transformers' own for the family (Sarvam-MoE's remote-code
    # names: `.attention.query_key_value.` read as `.self_attn.query_key_value.`): (stored,
    # read as) pairs, each in turn replacing every occurrence, after the prefix renames.
    segment_renames: tuple[tuple[str, str], ...] = ()
    # A map of every stored tensor name (after the renames) to the name read, where the
    # family's layout is not one layer per prefix (LongCat-Flash's two sublayers per layer:
    # families/longcat.py); None: as they are.
    stored_layout: Callable[[str], str] | None = None
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
    # The config key listing layers the model skips on text (Mllama's cross_attention_layers,
    # which attend to an image only): left out, the others read under consecutive indices
    # (export/skipped_layers.py).
    skipped_layers_key: str | None = None
    # Rows the embedding table has beyond vocab_size (Mllama's 8 image-token rows), which
    # the LM head does not.
    embed_extra_rows: int = 0
    # The config key giving those rows where config.json does (Molmo 2's
    # additional_vocab_size); None: embed_extra_rows.
    embed_extra_rows_key: str | None = None
    # The config key giving the rows the LM head has beyond vocab_size, whose logits the
    # model drops (Inkling's unembedding padded past unpadded_vocab_size, which its `legacy`
    # reads as the vocabulary); None: none.
    head_extra_rows_key: str | None = None
    # Tensors transformers concatenates (along their first axis) into one as it loads the
    # checkpoint (Molmo 2's wte.embedding and wte.new_embedding into embed_tokens): (the
    # name read, the stored names in order) pairs, names as read after the renames.
    joined: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Tensors transformers de-interleaves and cuts in two as it loads them (Inkling's
    # image-text checkpoints' w13: gate and up rows interleaved): (the stored name's suffix,
    # as read after the renames; the two halves' suffixes; the axis), read by
    # export/interleaved_halves.py.
    halves: tuple[tuple[str, tuple[str, str], int], ...] = ()
    # Whether a fused gate_up (names.gate_up) is stored up first, [up | gate] (Molmo 2's
    # ff_proj, which transformers chunks into up_proj then gate_proj).
    up_first: bool = False
    # The config key listing the layers that rotate on the scaled rope (Molmo 2's
    # rope_scaling_layers; null: every layer): the others rotate on the default rope of the
    # same theta (export/unscaled_rope.py). None: every layer on the one rope.
    rope_scaling_layers_key: str | None = None
    # The config key that scales each layer's attention scores by a further 1 / (layer + 1)
    # (GPT-2's scale_attn_by_inverse_layer_idx, as Stanford CRFM's Mistral checkpoints use).
    inverse_layer_scale_key: str | None = None
    # Gemma 4: layers may have a head size and KV head count of their own
    # (`per_layer_config`), the last `num_kv_shared_layers` read an earlier layer's KV,
    # `attention_k_eq_v` makes full layers' values their keys' projection, and
    # `hidden_size_per_layer_input` adds per-layer inputs (export/per_layer_input.py).
    per_layer_heads: bool = False
    # The config keys listing each layer's query heads and KV heads, one entry per layer
    # (OpenELM's layer-wise scaling, which its `legacy` derives as its config class does);
    # None: every layer has num_attention_heads and num_key_value_heads. A layer's MLP
    # needs no such list: the graph takes its width from the layer's weights.
    heads_per_layer: tuple[str, str] | None = None
    # Whether each layer is a NAS block of its own (Llama-Nemotron's `block_configs`:
    # export/nas_blocks.py): its attention and its FFN each whole, one linear layer or left
    # out, its MLP of its own width.
    nas_blocks: bool = False
    # Whether each layer type's `rope_parameters` entry rotates its own share of each head
    # (its partial_rotary_factor; Laguna), not one factor for every layer.
    rotary_per_type: bool = False
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
    # Whether only the sliding layers have sinks (MiMo-V2-Flash's full layers have none).
    sliding_sinks_only: bool = False
    # MiMo-V2-Flash's sliding layers hold this many times num_key_value_heads (2); the
    # full layers num_key_value_heads.
    sliding_kv_factor: int = 1
    # The key of a value head size of its own (MiMo-V2-Flash's v_head_dim, below head_dim:
    # padded to it in the graph, export/value_heads.py), and of a factor each value is
    # multiplied by (its attention_value_scale); None: head_dim, and no factor.
    v_head_dim_key: str | None = None
    value_scale_key: str | None = None
    # Multi-head latent attention (DeepSeek-V2's MLA, export/latent_attention.py): the
    # cache holds each token's latent and rotated key part, one KV head of
    # qk_rope_head_dim + kv_lora_rank.
    latent: bool = False
    # dots.3 (export/layer_latents.py): the latent attention as Dots3NoteTextAttention
    # builds it (its norms at rms_norm_eps, the key part RMS-normed, the LoRA scales on),
    # its sliding layers with latent sizes and heads of their own (per_layer_config).
    latent_layers: bool = False
    # Whether q_a_layernorm and kv_a_layernorm are at the model's rms_norm_eps (Hy4-VL's
    # HYV4VLAttention builds them so) rather than DeepSeek's fixed 1e-6 (LATENT_EPS).
    latent_norms_at_eps: bool = False
    # A.X K2: RMSNorms followed by a low-rank gate, y * sigmoid(fc2(silu(fc1(y)))), where
    # the checkpoint holds one (`{norm}.norm.weight`, `{norm}.mlp.fc1/fc2`: its input norms
    # and the norms before its experts); and its latent query fused with a gate per value
    # channel (`q_gate_proj` of [q_resid | q_a_proj's output], each head's query rows then
    # its v_head_dim gate rows), the values times its sigmoid before o_proj.
    gated_norms: bool = False
    latent_query_gate: bool = False
    # Hy4: the latent attention's values gated per channel by sigmoid(gate_proj(x)) of the
    # layer's normed input, before o_proj.
    latent_channel_gate: bool = False
    # DeepSeek Sparse Attention (export/sparse_index.py): a lightning indexer in front of the
    # latent attention, its rotary on "halves" (DeepSeek-V3.2) or "interleaved" pairs
    # (GLM-5) of its first dims, or on its last dims: "last_halves" (Hy4),
    # "last_interleaved" (Hy4-VL); None: none.
    sparse_index: str | None = None
    # MiniMax-M3's block index (export/block_index.py): a lightning indexer choosing each
    # query's blocks of keys, per KV head, on the layers its legacy hook lists as
    # `block_index_layers` (layer_types' "minimax_m3_sparse").
    block_index: bool = False
    # Whether the family's model reads a BitNet quantization_config (export/bitlinear.py):
    # its projections then BitLinear layers, the activations fake-quantized to int8.
    bitnet: bool = False
    # Whether the family's attention clamps q, k and v to [-clip_qkv, clip_qkv] where the
    # config sets clip_qkv (OLMo 1).
    clip_qkv: bool = False
    # Whether the final norm also normalizes the embedding before the first layer (nanochat).
    embed_norm: bool = False
    # Whether the embedding is RMS-normed without weight (at the norms' epsilon) before the
    # first layer (Muse Glimmer's normed embedding).
    embed_norm_weightless: bool = False
    # The final norm's kind where it differs from `norm` (Muse Glimmer: x * w after layers
    # of (1 + w) norms); None: `norm`.
    final_norm_kind: str | None = None
    # The key of the epsilon of the norms after each sublayer (a `sandwich` block's
    # post_attn_norm and post_mlp_norm), where they have their own (Muse Glimmer's
    # post_norm_eps); None: the model's norm epsilon.
    post_norm_eps_key: str | None = None
    # The kinds (of NORMS) of a `sandwich` block's norms after its attention and after its
    # MLP where they differ from `norm` (Muse Spark's: without weight, and input-scaled);
    # None: `norm`.
    post_norm_kinds: tuple[str | None, str | None] = (None, None)
    # Whether each head's attention output is RMS-normed without weight (at the norms'
    # epsilon) before the output gate and o_proj (Muse Spark's o_norm).
    out_norm_weightless: bool = False
    # The key of the temperature of a `sandwich` block's residual gates (Muse Spark's
    # residual_gate_temperature): each residual add is a * x + b * sublayer per channel, b =
    # sigmoid(gate / T), a = sqrt(max(sigmoid(-gate / T) (1 + b), 1e-3)), from the layer's
    # `post_attention_residual_gate.gate` and `post_feedforward_residual_gate.gate`; None:
    # no gates.
    residual_gate_key: str | None = None
    # Whether the first layer's attention reads the (normed) embedding without a norm of its
    # own (ModernBERT decoder's layer 0: an Identity attn_norm).
    first_layer_unnormed: bool = False
    # Whether a prediction head (names.head_dense, the activation of `head_act_key`,
    # names.head_norm) transforms the final hidden state before the LM head (ModernBERT
    # decoder's).
    head_act_key: str | None = None
    # Whether the model's rotate_half is cat(x2, -x1), a rotation by -angle (nanochat).
    # Exported as the standard rotary of q and k whose rotated second halves are negated in
    # their projection: q.k is the same (each is the reflected model's q or k reflected),
    # and so is a weightless q/k norm of it.
    rotary_reflected: bool = False
    # ALiBi (BLOOM, MPT; export/alibi.py): no rotary, and each head adds slope_h * (key
    # position - query position) to its scaled scores, the slopes computed at export
    # (ModelConfig.alibi, which is all the builder and the flavours read).
    alibi: bool = False
    # The config key that switches ALiBi on (Falcon's `alibi`: Falcon-RW), its bias built as
    # transformers' Falcon builds it: slope * key position in bfloat16 (export/alibi.py).
    alibi_key: str | None = None
    # Whether ALiBi replaces rotary, where config.json as read decides it (Baichuan: its
    # 13B config classes), its bias the plain relative one (export/alibi.py).
    alibi_from_config: Callable[[dict[str, Any]], bool] | None = None
    # Whether the LM head's rows are L2-normalized before the logits, where config.json as
    # read decides it (Baichuan 2's NormHead): export writes the rows normalized
    # (decoder._lm_head), in float32.
    head_normalized: Callable[[dict[str, Any]], bool] | None = None
    # The token ids whose logits the model sets to its dtype's minimum whatever the input,
    # from config.json as read (Chameleon's image tokens, which its text generation never
    # picks: export/masked_logits.py); None: none.
    masked_logits: Callable[[dict[str, Any]], tuple[int, ...]] | None = None

    # Inkling (export/inkling.py): every layer's keys, values and sublayer outputs through
    # residual short convolutions (one conv state per layer beside its KV), a relative bias
    # per backward distance from each query's state, its router's shared experts.
    inkling: bool = False

    # ZAYA's compressed convolutional attention (export/cca.py): q/k/v from its
    # projection with a convolution over time and a delayed value, two states beside each
    # layer's KV, and its L2 q/k norm with a learned key scale; every layer is one.
    cca: bool = False
    # Whether the embedding is (embedding + bias) * scale per channel before the first
    # layer (ZAYA's input_hidden_states_bias and input_hidden_states_scale).
    embed_affine: bool = False

    # Doge's dynamic mask attention (export/dynamic_mask.py): each key's bias per KV head
    # from its values (self_attn.dt_proj, self_attn.A) added to the scores, each query's
    # `keep_window_size` keys of the largest bias kept where there are more.
    dynamic_mask: bool = False
    # Doge's residual weights: each residual add is input_residual * x + attention and
    # post_attention_residual * x + MLP (per channel, the layer's own), in a "pre" block.
    residual_weights: bool = False
    # DiffLlama's differential attention (export/differential.py): each query head attends
    # over both halves of the KV heads' values, the second half of the heads' outputs times
    # lambda (from the layer's lambda_q1/k1/q2/k2 and its depth) subtracted from the first
    # half's, each difference RMS-normed without weight and scaled by 1 - lambda_init.
    differential: bool = False
    # JetMoE's mixture of attention heads (export/mixture_attention.py): the query and
    # output projections are routed experts of these names (the MLP experts' routing,
    # expert count and k), over keys and values every expert shares; None: none.
    attention_experts: MoaNames | None = None
    # The epsilon of the layers' norms where the model builds them at a fixed one whatever
    # config.json says (JetMoE's 1e-6), the final norm at the config's; None: the config's
    # for every norm.
    layer_norm_eps: float | None = None

    def read(self, raw: dict[str, Any]) -> dict[str, Any]:
        """config.json as the family's transformers config class reads it."""
        if self.unnest is not None:
            raw = self.unnest(raw)
        elif self.nested is not None:
            raw = self._language_model_config(raw)
        raw = {k: v for k, v in raw.items() if k not in self.ignores}
        raw = {**self.defaults, **raw}  # only absent keys: a null is the config's own
        check_objects(raw)  # the language model's own, where it was nested
        check_sizes(raw)  # before a legacy hook lists num_hidden_layers' layers
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


