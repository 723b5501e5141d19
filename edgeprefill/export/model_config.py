"""The normalized model config: `ModelConfig`'s fields and what they derive, the one
object every graph builder asks about a model.

Its reading from a Hugging Face config.json, every transformers version's spelling
normalized, is `config_reader.py` (`ModelConfig.from_hf`, `from_dir`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeprefill.contract import CONV, RECURRENT
from edgeprefill.errors import ExportError
from edgeprefill.export.altup import AltUpConfig
from edgeprefill.export.bitlinear import BitNetScheme
from edgeprefill.export.block_index import BlockIndex
from edgeprefill.export.bnb import BnbScheme
from edgeprefill.export.cca import CcaShape
from edgeprefill.export.config_checks import check_model_config
from edgeprefill.export.config_fields import (
    ACTIVATIONS as ACTIVATIONS,  # re-exported: `activation`'s values (tests import it here)
)
from edgeprefill.export.config_reader import read_config, read_config_dir
from edgeprefill.export.context_cap import ContextCap
from edgeprefill.export.experts import MoeConfig
from edgeprefill.export.families import BLOCKS, FamilySpec, TensorNames, family_spec
from edgeprefill.export.fp8 import Fp8Scheme
from edgeprefill.export.hyper_connections import HyperConfig
from edgeprefill.export.inkling import InklingShape
from edgeprefill.export.latent_attention import LatentShape
from edgeprefill.export.layer_attention import GLOBAL, LOCAL, LayerAttention
from edgeprefill.export.mixer_shapes import (
    DeltaNetShape,
    HybridScales,
    LruShape,
    MambaShape,
    MlstmShape,
    ResidualFactors,
    SelectiveShape,
)
from edgeprefill.export.nas_blocks import NasBlocks
from edgeprefill.export.prequantized import Int4Scheme
from edgeprefill.export.query_scale import QueryScale, ScalableSoftmax
from edgeprefill.export.rope import RopeConfig
from edgeprefill.export.shared_block import SharedBlockShape
from edgeprefill.export.sparse_index import IndexShape
from edgeprefill.export.swiglu_clamps import SwigluClamps


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    norm_eps: float
    max_positions: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    activation: str  # a value of ACTIVATIONS
    block: str  # a key of BLOCKS (a family may choose it from the config)
    ropes: dict[str, RopeConfig]
    layers: tuple[LayerAttention, ...]
    attn_scale: float  # multiplies q.k (head_dim**-0.5 unless the config says otherwise)
    # The final norm's epsilon where the layers' norms have another (JetMoE); None: norm_eps
    final_norm_eps: float | None = None
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c)
    final_softcap: float | None = None  # logits -> c * tanh(logits / c)
    embed_scale: float | None = None  # multiplies the embedding (Gemma, Granite)
    residual_scale: float = 1.0  # multiplies each sublayer's output (Granite)
    logits_divisor: float = 1.0  # divides the logits (Granite)
    logits_multiplier: float = 1.0  # multiplies the logits (Cohere's logit_scale)
    # a per-position factor of q (Ministral 3; Llama 4's and Beam's NoPE layers)
    query_scale: QueryScale | ScalableSoftmax | None = None
    # The longest context export supports where shorter than max_positions, and why
    # (export/context_cap.py: Llama 4's attention chunk, PhiMoE's longrope window)
    context_cap: ContextCap | None = None
    lm_head_bias: bool = False  # the LM head has a bias (FamilySpec.lm_head_bias or its key)
    # the LM head's rows L2-normalized before use (Baichuan 2's NormHead), written so
    lm_head_normalized: bool = False
    # the tokens whose logits are the dtype's minimum whatever the input (Chameleon's image
    # tokens: export/masked_logits.py)
    masked_tokens: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    fp8: Fp8Scheme | None = None  # how an FP8 checkpoint's weights are scaled (export/fp8.py)
    int4: Int4Scheme | None = None  # a GPTQ/AWQ/compressed-tensors one's (export/prequantized.py)
    bnb: BnbScheme | None = None  # a bitsandbytes one's, read dequantized (export/bnb.py)
    bitnet: BitNetScheme | None = None  # BitNet's layers (export/bitlinear.py); None: float
    clip_qkv: float | None = None  # q, k and v clamped to [-clip_qkv, clip_qkv] (OLMo 1)
    # LFM2: the layers that are gated short convolutions (their `layers` entry unused),
    # the convolution's width in tokens (conv_L_cache) and whether its projections and
    # convolution have biases (conv_bias).
    conv_layers: tuple[int, ...] = ()
    conv_kernel: int = 0
    conv_bias: bool = False
    # Qwen3.5: the layers that are Gated DeltaNet linear attention (`linear_attention` in
    # layer_types; their `layers` entry unused) and their dimensions.
    delta_layers: tuple[int, ...] = ()
    delta: DeltaNetShape | None = None
    # Granite 4.0-H: the layers that are Mamba-2 (`mamba` in layer_types; their `layers`
    # entry unused) and their dimensions.
    mamba_layers: tuple[int, ...] = ()
    mamba: MambaShape | None = None
    # Mamba-1 (mamba, falcon_mamba): mamba_layers are its selective-scan mixers instead.
    selective: SelectiveShape | None = None
    # RecurrentGemma: the layers that are RG-LRU recurrent blocks (`rg_lru` in layer_types;
    # their `layers` entry unused) and their dimensions.
    lru_layers: tuple[int, ...] = ()
    lru: LruShape | None = None
    # RWKV-4: the layers that are its blocks (all of them; export/rwkv.py), and every how
    # many layers the stream is halved at inference (rescale_every; 0: never).
    rwkv_layers: tuple[int, ...] = ()
    rescale_every: int = 0
    # MiniMax: the layers that are lightning attention (`linear_attention` in layer_types;
    # their `layers` entry unused; export/lightning.py), and its residual factors (block
    # "normed").
    lightning_layers: tuple[int, ...] = ()
    residual_factors: ResidualFactors | None = None
    # xLSTM: the layers that are mLSTM cells (all of them; export/mlstm.py) and their shape.
    mlstm_layers: tuple[int, ...] = ()
    mlstm: MlstmShape | None = None
    # Nemotron-H: the layers without an MLP (a mixer block another mixer follows), and the
    # checkpoint's block tensors read under the layers' names (export/layer_groups.py).
    mlp_less: tuple[int, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    # Llama-Nemotron: each layer's NAS block, its attention and FFN each whole, one linear
    # layer or left out (export/nas_blocks.py); None: every layer is whole.
    nas: NasBlocks | None = None
    # Zamba2: the shared transformer blocks applied before the mixers of some layers, each
    # application with its own KV (export/shared_block.py); None: none.
    shared_block: SharedBlockShape | None = None
    # The text family of a checkpoint that wraps one (LLaVA's: families/wrapped.py); None
    # elsewhere, the family's own spec.
    text_type: str | None = None
    # Mllama: the stored prefixes of the layers it skips on text (export/skipped_layers.py)
    left_out: tuple[str, ...] = ()
    # Falcon-H1 (block "hybrid"): its multipliers.
    scales: HybridScales | None = None
    # Qwen3.5 (Qwen3-Next's attention): q_proj gives each head's query and an output gate;
    # attention's output times sigmoid(gate) goes to o_proj.
    attn_gate: bool = False
    # LFM3: each head's attention output times sigmoid of its gate, a projection of the
    # layer's normed input (hidden -> heads; TensorNames.head_gate). Beam's gates each
    # channel, plus a bias per head (FamilySpec.channel_gate); Laguna's is softplus
    # (FamilySpec.softplus_gate).
    head_gate: bool = False
    # Whether that gate is one per channel (heads * head_dim of them: Beam's, and Laguna's
    # where `gating` says so), not one per head broadcast over head_dim.
    gate_per_channel: bool = False
    # The norm config.json picks (FamilySpec.norm_from_config); None: the family's own.
    norm_picked: str | None = None
    # The q/k norms config.json picks (FamilySpec.qk_norm_from_config); None: the family's.
    qk_norm_picked: str | None = None
    # Rows the embedding table has beyond vocab_size (FamilySpec.embed_extra_rows, or its
    # embed_extra_rows_key's value), which no logit reads.
    embed_extra_rows: int = 0
    # Rows the LM head has beyond vocab_size, whose logits the model drops (Inkling's
    # unembedding padded past unpadded_vocab_size): cut off at export.
    head_extra_rows: int = 0
    # Gemma 4: layers without KV of their own, each reading the KV an earlier layer of its
    # kind wrote in the same step (consumer -> producer; num_kv_shared_layers).
    shared_kv: dict[int, int] = field(default_factory=dict)
    # Gemma 4: full-attention layers whose values are their keys' projection (no v_proj).
    k_eq_v: bool = False
    # MiMo-V2-Flash: value heads of v_head_dim (None: head_dim), padded to head_dim in the
    # graph (export/value_heads.py), and each value times value_scale.
    v_head_dim: int | None = None
    value_scale: float = 1.0
    # Gemma 4's per-layer inputs (PLE): each layer's `per_layer_input`-wide slice of a second
    # embedding, mixed with a projection of the main one; 0: none.
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    # Routed experts in place of the MLP on moe.layers (export/moe.py); None: dense.
    moe: MoeConfig | None = None
    # Step 3.7's clamped SwiGLU bounds per layer (export/swiglu_clamps.py); None: no clamp.
    swiglu_clamps: SwigluClamps | None = None
    # Multi-head latent attention's dimensions (export/latent_attention.py); None: none.
    # Where set, num_kv_heads is 1 and head_dim the cached head's width (rope + latent),
    # rotary_dim the rope part, attn_scale transformers' (qk_head_dim^-0.5, yarn's mscale).
    latent: LatentShape | None = None
    # DeepSeek Sparse Attention's indexer (export/sparse_index.py) in front of the latent
    # attention; None: none, also where the bundle's context is within its index_topk
    # (for_context: every key kept, dense MLA exactly).
    sparse_index: IndexShape | None = None
    # MiniMax-M3's block index (export/block_index.py) on its indexed layers; None: none,
    # also where the bundle's context is within its reach (for_context: every block kept).
    block_index: BlockIndex | None = None
    # DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers), stored after
    # the last as model.layers.{num_layers + k}.: not the causal LM's, left out of export.
    mtp_layers: int = 0
    # Gemma 3n: AltUp's streams (export/altup.py; None: one stream), and each layer's
    # activation sparsity, the share of its MLP's gate cut away (0: none;
    # export/sparse_gate.py).
    altup: AltUpConfig | None = None
    sparsity: tuple[float, ...] = ()
    # Hy4: the residual stream's hyper-connections (export/hyper_connections.py; the
    # "hyper" block's), None elsewhere.
    hyper: HyperConfig | None = None
    # Whether config.json switches the family's q/k norms off (GLM-4.5's use_qk_norm false).
    qk_norm_off: bool = False
    # ALiBi (BLOOM, MPT): each head's slope, its scores plus slope * (key position - query
    # position) (export/alibi.py); None: no such bias.
    alibi: tuple[float, ...] | None = None
    # Whether that bias is Falcon's (Falcon-RW): slope * key position rounded to bfloat16,
    # added before the scores' scale (export/alibi.py).
    alibi_bfloat16: bool = False
    # Whether the last layer's output is normed before the LM head (OPT's post-norm layers
    # are not), and the embedding's width where it is narrower than hidden and projected
    # to and from it (OPT-350m's word_embed_proj_dim); None: hidden.
    final_norm: bool = True
    embed_width: int | None = None
    # The epsilon of a sandwich block's norms after its sublayers where theirs is their own
    # (FamilySpec.post_norm_eps_key); None: norm_eps.
    post_norm_eps: float | None = None
    # The temperature of a sandwich block's residual gates (FamilySpec.residual_gate_key:
    # Muse Spark's); None: no gates.
    residual_gate_temperature: float | None = None
    # The fused qkv's stored row layout where config.json decides it (Falcon: "heads" or
    # "groups", FamilySpec.qkv_layout_from_config); None: the spec's.
    qkv_layout: str | None = None
    # The row of XGLM's sinusoidal position table that is zeros (its padding index).
    pad_token_id: int | None = None
    # The activation of the prediction head before the LM head (ModernBERT decoder's, a
    # value of ACTIVATIONS); None: no such head.
    head_activation: str | None = None

    # ZAYA: its compressed convolutional attention's convolution widths (export/cca.py;
    # every layer's, each keeping KV beside two states) and its router's width
    # (router_hidden_size, export/zaya_router.py); None and 0: none.
    cca: CcaShape | None = None
    router_hidden: int = 0
    # Inkling's relative bias and short convolutions (export/inkling.py); None: not Inkling
    inkling: InklingShape | None = None

    # Doge's dynamic mask (FamilySpec.dynamic_mask): the keys each query keeps at most, its
    # keep_window_size; None: no dynamic mask.
    keep_window: int | None = None

    def __post_init__(self) -> None:
        check_model_config(self)
        if len(self.layers) != self.num_layers:  # layer_types or no_rope_layers disagree
            raise ExportError(
                f"layer_types lists {len(self.layers)} layers; num_hidden_layers is "
                f"{self.num_layers}"
            )
        for i, layer in enumerate(self.layers):
            rope = self.ropes[layer.rope or GLOBAL]
            if not 0 < rope.rotary_dim <= self.layer_head_dim(i):
                raise ExportError(
                    f"the rotary dimension {rope.rotary_dim} does not fit head_dim "
                    f"{self.layer_head_dim(i)} (check partial_rotary_factor)"
                )
        if self.block not in BLOCKS:
            raise ExportError(f"unknown block layout {self.block!r}")
        if self.conv_layers and self.conv_kernel < 2:
            raise ExportError(f"conv_L_cache must be at least 2, got {self.conv_kernel}")
        if not self.kv_layers and not self.spec.attention_free:
            raise ExportError("layer_types has no full_attention layer; export needs at "
                              "least one")
        delta = self.delta
        if delta is not None and (delta.conv_kernel < 2 or delta.value_heads % delta.key_heads):
            raise ExportError(
                f"linear_conv_kernel_dim must be at least 2 (got {delta.conv_kernel}) and "
                f"linear_num_value_heads ({delta.value_heads}) a multiple of "
                f"linear_num_key_heads ({delta.key_heads})")
        if self.selective is not None and self.selective.conv_kernel < 2:
            raise ExportError(f"conv_kernel must be at least 2, got {self.selective.conv_kernel}")
        mamba = self.mamba
        if mamba is not None and (mamba.conv_kernel < 2 or mamba.heads % mamba.groups):
            raise ExportError(
                f"mamba_d_conv must be at least 2 (got {mamba.conv_kernel}) and "
                f"mamba_n_heads ({mamba.heads}) a multiple of mamba_n_groups ({mamba.groups})")

    @property
    def spec(self) -> FamilySpec:
        return family_spec(self.family, self.text_type)

    @property
    def norm(self) -> str:
        """The model's norm kind (one of NORMS)."""
        return self.norm_picked or self.spec.norm

    @property
    def qk_norm(self) -> str | None:
        """The q/k norms this model has (FamilySpec.qk_norm's kinds; None: none)."""
        return None if self.qk_norm_off else self.qk_norm_picked or self.spec.qk_norm

    @property
    def alibi_bfloat16_scale(self) -> float | None:
        """The scores' scale that Falcon-RW's bfloat16 ALiBi bias takes (export/alibi.py);
        None: no such bias."""
        return self.attn_scale if self.alibi_bfloat16 else None

    @property
    def names(self) -> TensorNames:
        """The checkpoint's tensor names for the block this config chose."""
        return self.spec.block_names.get(self.block, self.spec.names)

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The layers without KV, carrying a recurrent state instead (ZAYA's carry both)."""
        return tuple(sorted((*self.conv_layers, *self.delta_layers, *self.mamba_layers,
                             *self.lru_layers, *self.rwkv_layers, *self.cca_layers,
                             *self.lightning_layers, *self.mlstm_layers,
                             *self.inkling_layers)))

    @property
    def inkling_layers(self) -> tuple[int, ...]:
        """Inkling's layers: attention with residual short convolutions, whose conv state
        sits beside the layer's KV (export/inkling.py)."""
        return tuple(range(self.num_layers)) if self.inkling is not None else ()

    @property
    def cca_layers(self) -> tuple[int, ...]:
        """ZAYA's layers: attention through CCA, its states beside the layer's KV."""
        return tuple(range(self.num_layers)) if self.cca is not None else ()

    @property
    def kv_state_layers(self) -> tuple[int, ...]:
        """The state layers that keep KV too: Falcon-H1's, attention beside Mamba-2,
        Zamba2's hybrid layers, a shared block's attention before Mamba-2, and ZAYA's,
        attention through CCA."""
        if self.shared_block is not None:
            return self.shared_block.layers
        if self.cca is not None:
            return self.cca_layers
        if self.inkling is not None:
            return self.inkling_layers
        return self.mamba_layers if self.block == "hybrid" else ()

    def block_of(self, layer: int) -> str:
        """The block layout of one layer: the spec's state_block for its state layers."""
        state_block = self.spec.state_block
        return state_block if state_block and layer in self.delta_layers else self.block

    def state_kinds(self, layer: int) -> tuple[str, ...]:
        """The recurrent states a state layer carries (contract.STATE_KINDS), in order."""
        if layer in self.delta_layers or layer in self.mamba_layers or \
                layer in self.lru_layers or layer in self.rwkv_layers or layer in self.cca_layers:
            return (CONV, RECURRENT)
        # MiniMax's lightning layers and xLSTM's mLSTM cells: one state without a
        # convolution (the mLSTM's C | n | m: export/mlstm.py)
        if layer in self.lightning_layers or layer in self.mlstm_layers:
            return (RECURRENT,)
        return (CONV,) if layer in self.conv_layers or layer in self.inkling_layers else ()

    def layer_head_dim(self, layer: int) -> int:
        return self.layers[layer].head_dim or self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        return self.layers[layer].kv_heads or self.num_kv_heads

    def layer_heads(self, layer: int) -> int:
        """The query heads of a layer (OpenELM's differ by layer)."""
        return self.layers[layer].heads or self.num_heads

    @property
    def attention_free_layers(self) -> tuple[int, ...]:
        """The layers with neither attention nor a state (Llama-Nemotron's NAS blocks whose
        attention is one linear layer or left out): no KV."""
        return self.nas.attention_free if self.nas is not None else ()

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that hold KV of their own: neither a state layer (but Falcon-H1's,
        which keep KV beside it), nor one reading another layer's KV, nor one without
        attention."""
        return tuple(i for i in range(self.num_layers)
                     if (i not in self.state_layers or i in self.kv_state_layers)
                     and i not in self.shared_kv and i not in self.attention_free_layers)

    def for_layer(self, layer: int) -> ModelConfig:
        """This config as one attention layer sees it: its head size, query heads and KV
        heads as the model's, and its rope under both names (so `rotary_dim` is its own)."""
        if all(each.head_dim is None and each.kv_heads is None and each.heads is None
               for each in self.layers):
            return self
        spec = self.layers[layer]
        rope = self.ropes[spec.rope or GLOBAL]
        return replace(self, head_dim=self.layer_head_dim(layer),
                       num_heads=self.layer_heads(layer),
                       num_kv_heads=self.layer_kv_heads(layer),
                       ropes={GLOBAL: rope, LOCAL: rope}, latent=spec.latent or self.latent)

    @property
    def rotary_dim(self) -> int:
        return self.ropes[GLOBAL].rotary_dim

    @property
    def sliding_window(self) -> int | None:
        """The largest window of any layer (None: every layer attends globally)."""
        windows = [layer.window for layer in self.layers if layer.window is not None]
        return max(windows) if windows else None

    def for_context(self, max_context: int) -> ModelConfig:
        """This config as a bundle of `max_context` positions computes it (longrope)."""
        from dataclasses import replace

        ropes = {name: rope.for_context(max_context) for name, rope in self.ropes.items()}
        index, latent, head_dim = self.sparse_index, self.latent, self.head_dim
        if index is not None and latent is not None:
            # the index key's columns join the cached head only where the indexer can bite
            index = index if max_context > index.topk else None
            latent = replace(latent, index_dim=index.head_dim if index else 0)
            head_dim = latent.cache_dim
        blocks, layers = self.block_index, self.layers
        if blocks is not None:
            # where the indexer bites, the index key's head and its query heads join the
            # indexed layers (block_index.py)
            blocks = blocks if max_context > blocks.reach else None
            layers = tuple(replace(layer, kv_heads=self.num_kv_heads + 1,
                                   heads=self.num_heads // self.num_kv_heads
                                   * (self.num_kv_heads + 1))
                           if blocks and i in blocks.layers else layer
                           for i, layer in enumerate(self.layers))
        return replace(self, ropes=ropes, sparse_index=index, latent=latent,
                       head_dim=head_dim, block_index=blocks, layers=layers)

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        return read_config(cls, raw)

    @classmethod
    def from_dir(cls, hf_dir: Path, classifier: bool = False) -> ModelConfig:
        """`classifier`: a supported family's sequence classifier is read (--task score)."""
        return read_config_dir(cls, hf_dir, classifier)
