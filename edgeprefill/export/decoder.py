"""Build the chunk graph of a decoder-only model straight from its config and weights.

One graph runs one step: B rows of C tokens each (a prefill chunk is B=1, a decode step is
B=active sessions with C=1). The contract (names and axes from edgeprefill/contract.py),
shared with the runtime through the manifest:

  inputs   input_ids        [B, C]            int64
           past_lens        [B]               int32  tokens already in each row's cache
           valid_lens       [B]               int32  valid tokens of the chunk (rest: padding)
           past_key.{i}     [B, KV, cap, D]   model dtype (and past_value.{i})
  outputs  logits           [B, vocab]        float32, only each row's last valid token
           (an embedding bundle's, `embed`: hidden [B, hidden], the final-normed state)
           present_key.{i}  [B, KV, cap, D]   the same buffer as past_key.{i}, updated in place
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from onnx.helper import np_dtype_to_tensor_dtype

from edgeprefill.contract import (
    BATCH,
    CAPACITY,
    CHUNK,
    HIDDEN,
    INPUT_IDS,
    LOGITS,
    PAST_LENS,
    VALID_LENS,
    kv_names,
)
from edgeprefill.errors import ExportError
from edgeprefill.export import differential
from edgeprefill.export.altup import AltUp
from edgeprefill.export.bitlinear import BitWeights
from edgeprefill.export.block_index import BlockIndexer
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.cca import CcaProjection, qk_normed
from edgeprefill.export.checkpoint import Checkpoint, stored_apart
from edgeprefill.export.dynamic_mask import DynamicMask
from edgeprefill.export.experts import MoeNames
from edgeprefill.export.families import TensorNames
from edgeprefill.export.flavors import Flavor, StepTensors, positions
from edgeprefill.export.gated_delta import GatedDeltaNet
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.head_affine_norm import head_affine_norm
from edgeprefill.export.hyper_connections import ATTENTION, MLP, HyperConnections
from edgeprefill.export.inkling import InklingLayers
from edgeprefill.export.kimi_delta import KimiDeltaAttention
from edgeprefill.export.latent_attention import LatentAttention, LatentShape
from edgeprefill.export.layer_attention import LayerAttention
from edgeprefill.export.lightning import LightningAttention
from edgeprefill.export.lm_head import embedding_weight, head_weight
from edgeprefill.export.mamba1 import Mamba1
from edgeprefill.export.mamba1_heads import MultiHeadMamba1
from edgeprefill.export.mamba2 import Mamba2
from edgeprefill.export.masked_logits import masked
from edgeprefill.export.mixture_attention import MixtureOfAttention
from edgeprefill.export.mlstm import Mlstm
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.moe import MixtureOfExperts
from edgeprefill.export.moe_op import CLAMPED_AFTER, MoeOp, clamped_after, why_unrolled
from edgeprefill.export.nas_blocks import FULL, LINEAR, LINEAR_ATTENTION, LINEAR_MLP, NONE
from edgeprefill.export.per_layer_input import PerLayerInputs
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.export.residual_gate import residual_gate_factors
from edgeprefill.export.rg_lru import RgLru
from edgeprefill.export.rwkv import Rwkv
from edgeprefill.export.shared_block import SharedBlock
from edgeprefill.export.shared_kv import SharedKV
from edgeprefill.export.short_conv import ShortConv
from edgeprefill.export.sinusoids import ctrl_sinusoids, xglm_sinusoids
from edgeprefill.export.sparse_gate import sparse_gate
from edgeprefill.export.sparse_index import Indexer
from edgeprefill.export.swiglu_clamps import bounds_by_prefix, clamped_glu
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.value_heads import cut_values, pad_values
from edgeprefill.export.weights import GraphWeights
from edgeprefill.export.xielu import xielu
from edgeprefill.export.zaya_router import ZayaRouter

log = logging.getLogger(__name__)

Rows = Callable[[str], str]  # which of a layer's tokens go on after its attention
# the families.NORMS of LayerNorm
LAYER_NORMS = ("layer", "layer_no_bias", "layer_plus_one", "layer_no_affine")
UNBIASED = ("layer_no_bias", "layer_no_affine")  # LayerNorms without bias
WEIGHTLESS = ("layer_no_affine", "rms_no_weight")  # norms without weight


def _every_token(x: str) -> str:
    return x


def unrolled_experts_warning(experts: int, reason: str, where: str = "") -> None:
    # A dozen nodes per expert run each step whether chosen or not: with many experts
    # that is most of a decode step (docs/benchmarks.md, mixture-of-experts decode).
    log.warning("the %d experts per layer are written out one by one%s, not as ONNX "
                "Runtime's MoE op: %s; decode runs several times slower than an fp32, "
                "int8 or int4 `ort` bundle", experts, where, reason)


class DecoderBuilder:
    """Emits the graph layer by layer; weights stay lazy (read when the writer asks)."""

    def __init__(
        self, cfg: ModelConfig, ckpt: Checkpoint, flavor: Flavor,
        quant: QuantConfig | None = None, embed: bool = False,
    ) -> None:
        """`embed`: the graph's output is `hidden` (an embedding bundle's), not `logits`."""
        self.cfg = cfg
        self.embed = embed
        self.ckpt = ckpt
        self.flavor = flavor
        self.quant = quant
        self.dtype = flavor.dtype
        self.g = GraphBuilder()
        self.w = GraphWeights(self.g, ckpt, self.dtype, quant) if cfg.bitnet is None else \
            BitWeights(self.g, ckpt, self.dtype, quant, cfg.bitnet, flavor.integer_matmul)
        # (head_dim, kv_heads, rotary_dim) -> the flavour of layers of that shape (Gemma 4)
        self._flavors: dict[tuple[int, int, int], Flavor] = {}
        # layer prefix -> the (routed, shared or dense) bounds of its clamped SwiGLU (Step 3.7)
        self.clamps = bounds_by_prefix(cfg.swiglu_clamps, self.names.layer)
        self.experts = self._experts()
        # the layer prefixes whose MLP is routed experts
        self.expert_layers = {self.names.layer.format(i=i)
                              for i in (cfg.moe.layers if cfg.moe else ())}
        # layer prefix -> the activation sparsity of its MLP's gate (Gemma 3n), where any
        self.sparse_layers = {self.names.layer.format(i=i): s
                              for i, s in enumerate(cfg.sparsity) if s > 0}
        self._shortcut: str | None = None  # LongCat-Flash: the experts' output to add
        self.altup = (AltUp(self.g, self.w, cfg.altup, cfg.hidden_size, self._norm)
                      if cfg.altup is not None else None)
        self.hyper = (HyperConnections(self.g, self.w, cfg.hyper, cfg.hidden_size, self.dtype)
                      if cfg.hyper is not None else None)
        self.moa = self._attention_experts()

    def _experts(self) -> MixtureOfExperts | None:
        """The emitter of the model's mixture-of-experts blocks: ONNX Runtime's op where the
        flavour has it and it computes the family's routing, else the unrolled dispatch."""
        cfg, spec = self.cfg, self.cfg.spec.moe
        if cfg.moe is None or spec is None:
            return None
        experts = MixtureOfExperts(self.g, self.w, self.ckpt, cfg.moe, spec.names,
                                   cfg.hidden_size, self.dtype, self._activation, self.clamps,
                                   self._norm)
        if not self.flavor.moe_op:
            return experts
        # A pre-quantized checkpoint's experts are read dequantized (export/prequantized.py):
        # float where only its own int4 layers are int4 (QuantConfig.float_layers False).
        quant = self.quant if self.quant is None or self.quant.float_layers else None
        reason = why_unrolled(experts, cfg.activation, quant)
        layers = [self.names.layer.format(i=i) for i in cfg.moe.layers]
        if reason is None:
            unrolled = sum(clamped_after(experts, p) for p in layers)
            if unrolled:
                unrolled_experts_warning(cfg.moe.experts, CLAMPED_AFTER,
                                         f" on {unrolled} of the {len(layers)} expert layers")
            return MoeOp(experts, quant)
        unrolled_experts_warning(cfg.moe.experts, reason)
        return experts

    def build(self) -> GraphBuilder:
        g, cfg = self.g, self.cfg
        ids = g.input(INPUT_IDS, np.int64, [BATCH, CHUNK])
        past_lens = g.input(PAST_LENS, np.int32, [BATCH])
        valid_lens = g.input(VALID_LENS, np.int32, [BATCH])
        if self.embed:
            g.output(HIDDEN, np.float32, [BATCH, cfg.hidden_size])
        else:
            g.output(LOGITS, np.float32, [BATCH, cfg.vocab_size])
        chunk = g.op("Slice", [g.op("Shape", [ids]), g.const([1]), g.const([2])])  # [1]
        self.tokens = (PackedTokens(g, valid_lens, chunk) if self.flavor.packs_tokens
                       else PaddedTokens(g, valid_lens))
        self._recurrent_mixers(past_lens, valid_lens, chunk)
        self._declare_kv_io()
        step = self._step_tensors(past_lens, chunk)
        self.shared = (SharedKV(g, self.flavor, past_lens, valid_lens)
                       if cfg.shared_kv else None)
        self.ple = (PerLayerInputs(g, self.w, cfg, self.tokens, self._norm, self._activation)
                    if cfg.per_layer_input else None)
        self.q_scale = self._query_scale(past_lens, chunk)
        self.indexer = Indexer(self) if cfg.sparse_index is not None else None
        # MiniMax-M3's indexed layers (export/block_index.py)
        self.blocks = BlockIndexer(self) if cfg.block_index is not None else None
        self._latents: dict[tuple[LatentShape, int], LatentAttention] = {}
        x = self._embed(ids)  # [B,C,hidden] or packed [1,T,hidden]
        if cfg.embed_width is not None:  # OPT-350m: a narrower table, projected
            x = self.w.linear(x, [self.names.project_in + ".weight"], None)
        self.shared_block = SharedBlock(self, x) if cfg.shared_block is not None else None
        x = self._first_residual(x, ids, past_lens, chunk)
        delta = None  # a sublayer's output, added to the residual by the next norm
        cut = min(cfg.shared_kv, default=None)  # Gemma 4: from here on, the last tokens only
        for layer in range(cfg.num_layers):
            if layer == cut:
                x, delta = self._last_tokens(x, delta), None
            last = layer == cfg.num_layers - 1 and cut is None
            rows = self.tokens.last if last else _every_token
            x, delta = self._layer(layer, x, delta, step, rows)
            x, delta = self._layer_tail(layer, x, delta, rows)
        if delta is not None:
            x = g.op("Add", [x, delta])
        if self.altup is not None:
            x = self.altup.collapse(x)
        if self.hyper is not None:  # Hy4: the streams mixed into one
            x = self.hyper.head(x)
        if self.embed:
            g.rename(self._output_hidden(x), HIDDEN)
        else:
            g.rename(self._output_logits(x), LOGITS)
        return g

    def _recurrent_mixers(self, past_lens: str, valid_lens: str, chunk: str) -> None:
        """The builders of the layers other than attention (short conv, Gated DeltaNet,
        Mamba, RG-LRU, RWKV, mLSTM) the config has, on one causal convolution; None for the
        others."""
        g, cfg = self.g, self.cfg
        conv = CausalConv(g, self.dtype, past_lens, valid_lens) if cfg.state_layers else None
        self.short_conv = (ShortConv(g, self.w, cfg, self.tokens, conv)
                           if conv is not None and cfg.conv_layers else None)
        delta = KimiDeltaAttention if cfg.spec.kda else GatedDeltaNet
        self.delta_net = (delta(g, self.w, cfg, self.tokens, conv, past_lens, valid_lens, chunk)
                          if conv is not None and cfg.delta_layers else None)
        mamba = Mamba2 if cfg.selective is None else \
            MultiHeadMamba1 if cfg.selective.heads else Mamba1
        self.mamba = (mamba(g, self.w, cfg, self.tokens, conv, past_lens, valid_lens, chunk)
                      if conv is not None and cfg.mamba_layers else None)
        self.lru = (RgLru(g, self.w, cfg, self.tokens, conv, past_lens, valid_lens, chunk)
                    if conv is not None and cfg.lru_layers else None)
        self.rwkv = (Rwkv(g, self.w, cfg, self.tokens, conv, past_lens, valid_lens, chunk,
                          self._norm) if conv is not None and cfg.rwkv_layers else None)
        self.lightning = (LightningAttention(g, self.w, cfg, self.tokens, conv, past_lens,
                                             valid_lens, chunk)
                          if conv is not None and cfg.lightning_layers else None)
        self.mlstm = (Mlstm(g, self.w, cfg, self.tokens, conv, past_lens, valid_lens, chunk)
                      if conv is not None and cfg.mlstm_layers else None)
        self.cca = (CcaProjection(g, self.w, cfg.cca, cfg.hidden_size, cfg.num_heads,
                                  cfg.num_kv_heads, cfg.head_dim, self.tokens, conv)
                    if conv is not None and cfg.cca is not None else None)
        self.inkling = (InklingLayers(self, conv)
                        if conv is not None and cfg.inkling is not None else None)
        self.router = (ZayaRouter(g, self.ckpt, cfg.moe.experts, cfg.hidden_size,
                                  cfg.router_hidden, self.dtype, self._norm)
                       if cfg.moe is not None and cfg.moe.routing == "zaya" else None)

    def _first_residual(self, x: str, ids: str, past_lens: str, chunk: str) -> str:
        """The first layer's input from the tokens' embeddings `x`: scaled, plus the learned
        or sinusoidal positions, normed where the family norms it; Gemma 4's per-layer
        inputs read from it, and Gemma 3n's AltUp streams expanded from it."""
        g, cfg = self.g, self.cfg
        if cfg.embed_scale is not None:  # the tokens' embedding only, not the positions'
            x = g.op("Mul", [x, g.const(cfg.embed_scale, self.dtype)])
        if cfg.spec.embed_affine:  # ZAYA: (x + bias) * scale, per channel
            x = self._affine(x, "model.input_hidden_states_bias",
                             "model.input_hidden_states_scale")
        if self.names.position_embed is not None or cfg.spec.sinusoidal_positions:
            x = g.op("Add", [x, self._position_embedding(past_lens, chunk)])
        if cfg.spec.embed_norm:  # nanochat
            x = self._norm(x, self.names.final_norm)
        if cfg.spec.embed_norm_weightless:  # Muse Glimmer
            x = self._weightless_norm(x, cfg.hidden_size)
        if self.names.embed_norm is not None:  # BLOOM's, ModernBERT decoder's
            x = self._norm(x, self.names.embed_norm)
        if self.ple is not None:
            self.ple.build(ids, x)
        if self.altup is not None:  # Gemma 3n: x is the AltUp streams [.., N, hidden]
            x = self.altup.expand(x)
        if self.hyper is not None:  # Hy4: x is the hyper-connections' streams
            x = self.hyper.expand(x)
        return x

    def _output_logits(self, x: str) -> str:
        """float32 logits [B, vocab] from the last layer's output: the final norm, OPT's
        projection out, ModernBERT decoder's prediction head, the LM head and its scaling."""
        g, cfg = self.g, self.cfg
        # Only each row's last valid token reaches the LM head (the last layer kept only
        # those): full [C, vocab] logits of a 256-token chunk would cost more than a layer.
        hidden = self._final_norm(x)  # [B,hidden]
        if cfg.embed_width is not None:
            hidden = self.w.linear(hidden, [self.names.project_out + ".weight"], None)
        if cfg.head_activation is not None:  # ModernBERT decoder's prediction head
            dense = self.w.linear(hidden, [self.names.head_dense + ".weight"], None)
            hidden = self._norm(self._activation(dense, cfg.head_activation),
                                self.names.head_norm)
        logits = self._logits(self._lm_head(hidden))
        if self.dtype != np.float32:
            logits = g.op("Cast", [logits], to=1)
        return logits

    def _output_hidden(self, x: str) -> str:
        """float32 [B, hidden] from the last layer's output (each row's last valid token):
        the final norm, what transformers' base model returns as last_hidden_state and
        what the logits would be computed from."""
        hidden = self._final_norm(x)
        return self.g.op("Cast", [hidden], to=1) if self.dtype != np.float32 else hidden

    def _final_norm(self, x: str) -> str:
        """The last layer's output normed where the model norms it, by the final norm's own
        kind (FamilySpec.final_norm_kind: Muse Glimmer's) and epsilon (JetMoE's: its
        layers' at 1e-6, this one at rms_norm_eps) where it has them."""
        if not self.cfg.final_norm:
            return x
        return self._norm(x, self.names.final_norm, eps=self.cfg.final_norm_eps,
                          kind=self.cfg.spec.final_norm_kind)

    def _step_tensors(self, past_lens: str, chunk: str) -> StepTensors:
        """What every attention layer reads; none where no layer attends (Mamba-2), whose
        graph has no KV input to size a mask or rotary table by."""
        if not self.cfg.kv_layers:
            return StepTensors(past_lens, chunk, {})
        first = kv_names(self.cfg.kv_layers[0]).past_key
        return self.flavor.step_tensors(self.g, past_lens, chunk, first)

    def _query_scale(self, past_lens: str, chunk: str) -> str | None:
        """Each token's query factor (Ministral 3), [B,C,1] or packed [1,T,1], or None."""
        if self.cfg.query_scale is None:
            return None
        at = positions(self.g, self.g.op("Cast", [past_lens], to=7), chunk)  # [B,C]
        return self.tokens.gather(self.cfg.query_scale.emit(self.g, at, self.dtype), 1)

    @property
    def names(self) -> TensorNames:
        return self.cfg.names

    def _declare_kv_io(self) -> None:
        cfg = self.cfg
        layers = cfg.kv_layers
        shapes = {i: [BATCH, cfg.layer_kv_heads(i), CAPACITY, cfg.layer_head_dim(i)]
                  for i in layers}
        for layer in layers:
            names = kv_names(layer)
            self.g.input(names.past_key, self.dtype, shapes[layer])
            self.g.input(names.past_value, self.dtype, shapes[layer])
        states = [spec for layer in cfg.state_layers for spec in self._mixer_of(layer)
                  .states(layer)]
        for names, dtype, state in states:
            self.g.input(names.past, dtype, state)
        for layer in layers:
            names = kv_names(layer)
            self.g.output(names.present_key, self.dtype, shapes[layer])
            self.g.output(names.present_value, self.dtype, shapes[layer])
        for names, dtype, state in states:
            self.g.output(names.present, dtype, state)

    Mixer = ShortConv | GatedDeltaNet | Mamba1 | Mamba2 | RgLru | Rwkv | Mlstm | CcaProjection \
        | LightningAttention | InklingLayers

    def _attention_experts(self) -> MixtureOfAttention | None:
        """JetMoE's routed query and output projections (export/mixture_attention.py),
        routed as its MLP experts are, each expert KV heads of queries wide."""
        cfg, names = self.cfg, self.cfg.spec.attention_experts
        if names is None:
            return None
        assert cfg.moe is not None  # the family's MoeSpec gives their count and k
        width = cfg.num_kv_heads * cfg.head_dim
        router = MixtureOfExperts(self.g, self.w, self.ckpt, replace(cfg.moe, width=width),
                                  MoeNames(router=(names.router,)), cfg.hidden_size,
                                  self.dtype, self._activation)
        return MixtureOfAttention(router, names, cfg.num_kv_heads, cfg.head_dim)

    def _mixer_of(self, layer: int) -> Mixer:
        """The emitter of a state layer's token mixer (ZAYA's: its attention's states)."""
        mixer: DecoderBuilder.Mixer | None = (
            self.cca if layer in self.cfg.cca_layers else
            self.inkling if layer in self.cfg.inkling_layers else
            self.short_conv if layer in self.cfg.conv_layers else
            self.mamba if layer in self.cfg.mamba_layers else
            self.lru if layer in self.cfg.lru_layers else
            self.rwkv if layer in self.cfg.rwkv_layers else
            self.lightning if layer in self.cfg.lightning_layers else
            self.mlstm if layer in self.cfg.mlstm_layers else self.delta_net)
        assert mixer is not None
        return mixer

    def _layer(self, i: int, x: str, delta: str | None, step: StepTensors,
               rows: Rows) -> tuple[str, str | None]:
        """One decoder layer wired as its family's block (families.BLOCKS); returns the
        residual stream and a sublayer output still to be added to it, which the next
        norm adds (one fused residual-add + norm where the flavour has one).

        Attention reads every token of the layer's input (their keys and values go into the
        cache); what follows it runs on `rows` of the tokens: in the last layer only each
        row's last valid token, the one the LM head reads, so a prefill chunk skips that
        layer's output projection, MLP and norms for its other tokens (as llama.cpp does)."""
        n = self.names
        p = n.layer.format(i=i)
        block = self.cfg.block_of(i)
        if block == "altup":
            return self._altup_layer(i, x, step, rows), None
        if block == "rwkv":  # RWKV-4: both sublayers read the token before (rwkv.py)
            assert self.rwkv is not None
            x = x if delta is None else self.g.op("Add", [x, delta])
            return self.rwkv.layer(p, x, i, rows), None
        if block == "post":  # OLMo 2: the norms follow the sublayers
            x = x if delta is None else self.g.op("Add", [x, delta])
            attn = self._norm(self._mixer(i, x, step, rows), p + n.post_attn_norm)
            x = self.g.op("Add", [rows(x), self._scaled(attn)])
            return x, self._scaled(self._norm(self._mlp(p, x), p + n.post_mlp_norm))
        if block == "postln":  # OPT-350m, GPT-1: each norm after its residual add
            return self._post_norm_layer(i, x, delta, step, rows), None
        if block == "scaled":  # ZAYA
            return self._scaled_layer(i, x, step, rows), None
        if block == "shortcut":  # LongCat-Flash
            return self._shortcut_layer(i, x, delta, step, rows)
        if block == "normed":  # MiniMax: the residual is the normed stream
            x = x if delta is None else self.g.op("Add", [x, delta])
            return self._normed_layer(i, x, step, rows), None
        if block == "inkling":  # residual short convolutions around each sublayer
            assert self.inkling is not None
            x = x if delta is None else self.g.op("Add", [x, delta])
            return self.inkling.layer(i, x, step, rows), None
        if block == "hyper":  # Hy4: the streams of hyper-connections
            return self._hyper_layer(i, x, step, rows), None
        if self.shared_block is not None and i in self.cfg.kv_state_layers:  # Zamba2
            x = x if delta is None else self.g.op("Add", [x, delta])
            shared = self.shared_block.apply(i, x, step)
            h = self._norm(self.g.op("Add", [x, shared]), p + n.input_norm)
            return rows(x), self._mixer(i, h, step, rows)
        if self.cfg.nas is not None:  # Llama-Nemotron
            return self._nas_layer(i, x, delta, step, rows)
        if i == 0 and self.cfg.spec.first_layer_unnormed:  # ModernBERT decoder
            h = x
        else:
            x, h = self._add_norm(x, delta, p + n.input_norm)
        if block == "hybrid":  # Falcon-H1: attention and Mamba-2 side by side
            x, h = self._add_norm(rows(x), self._hybrid_mixers(i, h, step, rows),
                                  p + n.post_attn_norm)
            return x, self._mlp(p, h)
        attn = self._mixer(i, h, step, rows)
        x = rows(x)
        if i in self.cfg.mlp_less:  # Nemotron-H: a mixer block another mixer follows
            return x, self._scaled(attn)
        if block == "shared":  # Phi: attention and MLP read the same normed input
            return self.g.op("Add", [x, attn]), self._mlp(p, rows(h))
        if block == "parallel":  # GPT-NeoX: each has its own norm of the layer's input
            mlp = self._mlp(p, self._norm(x, p + n.post_attn_norm))
            return self.g.op("Add", [x, attn]), mlp
        if block == "sandwich":  # Gemma 2/3: norms before and after each sublayer
            eps = self.cfg.post_norm_eps  # Muse Glimmer's own (None: norm_eps)
            kinds = self.cfg.spec.post_norm_kinds  # Muse Spark's own (None: the model's)
            attn = self._scaled(self._norm(attn, p + n.post_attn_norm, eps=eps, kind=kinds[0]))
            x, attn = self._depth_scaled(x, attn, 2 * (i + 1))
            x, attn = self._residual_gated(x, attn, p + "post_attention_residual_gate")
            x, h = self._add_norm(x, attn, p + n.pre_mlp_norm)
            mlp = self._scaled(self._norm(self._mlp(p, h), p + n.post_mlp_norm, eps=eps,
                                          kind=kinds[1]))
            x, mlp = self._depth_scaled(x, mlp, 2 * (i + 1) + 1)
            return self._residual_gated(x, mlp, p + "post_feedforward_residual_gate")
        x, h = self._add_norm(self._residual(p, x, "input_residual"), self._scaled(attn),
                              p + n.post_attn_norm)
        return self._residual(p, x, "post_attention_residual"), self._scaled(self._mlp(p, h))

    def _scaled_layer(self, i: int, x: str, step: StepTensors, rows: Rows) -> str:
        """ZAYA's layer: a pre-norm block whose two residual adds scale both sides per
        channel (_scaled_add); its attention is CCA's (export/cca.py), its MLP experts
        chosen by its own router (export/zaya_router.py)."""
        n = self.names
        p = n.layer.format(i=i)
        attn = self._attention(i, self._norm(x, p + n.input_norm), step, rows)
        x = self._scaled_add(p + "post_attention_residual_scale.", attn, rows(x))
        mlp = self._mlp(p, self._norm(x, p + n.post_attn_norm), rows)
        return self._scaled_add(p + "post_mlp_residual_scale.", mlp, x)

    def _shortcut_layer(self, i: int, x: str, delta: str | None, step: StepTensors,
                        rows: Rows) -> tuple[str, str]:
        """LongCat-Flash's model layer i // 2 as decoder layers i and i + 1 (i even), each
        a pre-norm attention and dense MLP (its stored sublayers, families/longcat.py). The
        experts read layer i's MLP input; their output skips layer i + 1's attention and
        joins its MLP's residual add."""
        n = self.names
        p = n.layer.format(i=i)
        x, h = self._add_norm(x, delta, p + n.input_norm)
        attn = self._attention(i, h, step, rows)
        x, h = self._add_norm(rows(x), attn, p + n.post_attn_norm)
        mlp = self._dense_mlp(p, h)
        if i % 2 == 0:  # (never the last layer: every token)
            assert self.experts is not None
            self._shortcut = self.experts.block(p, h)
            return x, mlp
        assert self._shortcut is not None
        return x, self.g.op("Add", [mlp, rows(self._shortcut)])

    def _normed_layer(self, i: int, x: str, step: StepTensors, rows: Rows) -> str:
        """MiniMax's layer: each residual add takes the normed stream, not the stream, each
        side times its factor (the attention's by the layer's kind: softmax or lightning)."""
        n, factors = self.names, self.cfg.residual_factors
        assert factors is not None
        p = n.layer.format(i=i)
        h = self._norm(x, p + n.input_norm)
        alpha, beta = factors.linear if i in self.cfg.lightning_layers else factors.full
        x = self.g.op("Add", [self._times(rows(h), alpha),
                              self._times(self._mixer(i, h, step, rows), beta)])
        h = self._norm(x, p + n.post_attn_norm)
        alpha, beta = factors.mlp
        return self.g.op("Add", [self._times(h, alpha), self._times(self._mlp(p, h), beta)])

    def _hyper_layer(self, i: int, streams: str, step: StepTensors, rows: Rows) -> str:
        """Hy4's layer on the streams [.., M * hidden] (export/hyper_connections.py): each
        pre-norm sublayer reads its connection's mix of the streams and is written back
        into each of them by that connection's weight."""
        n, hyper = self.names, self.hyper
        assert hyper is not None
        p = n.layer.format(i=i)
        post, h = hyper.mix(p + ATTENTION, streams)
        attn = self._mixer(i, self._norm(h, p + n.input_norm), step, rows)
        streams = hyper.write_back(rows(post), attn, rows(streams))
        post, h = hyper.mix(p + MLP, streams)
        return hyper.write_back(post, self._mlp(p, self._norm(h, p + n.post_attn_norm)),
                                streams)

    def _scaled_add(self, m: str, y: str, x: str) -> str:
        """ZayaResidualScaling `m`: (y + hidden_states_bias) * hidden_states_scale +
        (x + residual_bias) * residual_scale."""
        return self.g.op("Add", [
            self._affine(y, m + "hidden_states_bias", m + "hidden_states_scale"),
            self._affine(x, m + "residual_bias", m + "residual_scale")])

    def _affine(self, x: str, bias: str, scale: str) -> str:
        """(x + bias) * scale, each stored [hidden]."""
        shape = (self.cfg.hidden_size,)
        self.w.check_shapes([(bias, shape), (scale, shape)], f"hidden {shape[0]}")
        return self.g.op("Mul", [self.g.op("Add", [x, self.w.tensor(bias)]),
                                 self.w.tensor(scale)])

    def _residual(self, p: str, x: str, name: str) -> str:
        """Doge (FamilySpec.residual_weights): the residual x times the layer's own weight
        per channel before the sublayer's output is added; x elsewhere."""
        if not self.cfg.spec.residual_weights:
            return x
        self.w.check_shapes([(p + name, (self.cfg.hidden_size,))],
                            f"hidden {self.cfg.hidden_size}")
        return self.g.op("Mul", [x, self.w.tensor(p + name)])

    def _nas_layer(self, i: int, x: str, delta: str | None, step: StepTensors,
                   rows: Rows) -> tuple[str, str | None]:
        """Llama-Nemotron's NAS block (export/nas_blocks.py): Llama's layer whose attention
        and MLP may each be one linear layer, or left out with their norm (the stream and
        the output still to be added to it pass on)."""
        n, nas = self.names, self.cfg.nas
        assert nas is not None
        p = n.layer.format(i=i)
        if nas.attention[i] == NONE:
            x, delta = rows(x), None if delta is None else rows(delta)
        else:
            x, h = self._add_norm(x, delta, p + n.input_norm)
            delta = self._attention(i, h, step, rows) if nas.attention[i] == FULL else \
                self.w.linear(rows(h), [p + LINEAR_ATTENTION], None)
            x = rows(x)
        if nas.ffn[i] == NONE:
            return x, delta
        x, h = self._add_norm(x, delta, p + n.post_attn_norm)
        if nas.ffn[i] == LINEAR:
            return x, self.w.linear(h, [p + LINEAR_MLP], None)
        width = nas.widths[i]  # the MLP's own width (check_mlp checks the rest agree)
        self.w.check_shapes([(p + n.up + ".weight", (width, self.cfg.hidden_size))],
                            f"block_configs[{i}].ffn.ffn_mult's width {width}")
        return x, self._mlp(p, h)

    def _post_norm_layer(self, i: int, x: str, delta: str | None, step: StepTensors,
                         rows: Rows) -> str:
        """OPT-350m's and GPT-1's layer: attention and MLP read the residual stream itself,
        and each residual add is normed."""
        g, n = self.g, self.names
        p = n.layer.format(i=i)
        x = x if delta is None else g.op("Add", [x, delta])
        attn = self._mixer(i, x, step, rows)
        x = self._norm(g.op("Add", [rows(x), attn]), p + n.input_norm)
        return self._norm(g.op("Add", [x, self._mlp(p, x)]), p + n.post_attn_norm)

    def _altup_layer(self, i: int, streams: str, step: StepTensors, rows: Rows) -> str:
        """Gemma 3n's layer on AltUp's streams [.., N, hidden] (export/altup.py): Gemma 3's
        sandwich on the predicted active stream, with a LAuReL branch beside the attention
        and the per-layer input added to the corrected streams but the first."""
        g, n, altup = self.g, self.names, self.altup
        assert altup is not None and self.ple is not None
        p = n.layer.format(i=i)
        predictions = altup.predict(p, streams)
        active = altup.active(predictions)
        h = self._norm(active, p + n.input_norm)
        attn = self._norm(self._mixer(i, h, step, rows), p + n.post_attn_norm)
        h, active, predictions = rows(h), rows(active), rows(predictions)
        both = g.op("Add", [g.op("Add", [active, attn]), self._laurel(p, h)])
        x = g.op("Div", [both, g.const(2.0 ** 0.5, self.dtype)])
        mlp = self._norm(self._mlp(p, self._norm(x, p + n.pre_mlp_norm)), p + n.post_mlp_norm)
        corrected = altup.correct(p, predictions, g.op("Add", [x, mlp]))
        gated = self.ple.layer(p, altup.scaled_active(p, corrected), i, rows)
        return altup.add_to_others(corrected, gated)

    def _laurel(self, p: str, h: str) -> str:
        """Gemma 3n's LAuReL: h plus the norm of a rank-`laurel_rank` projection of it."""
        left = self.w.linear(h, [p + "laurel.linear_left.weight"], None)
        right = self.w.linear(left, [p + "laurel.linear_right.weight"], None)
        return self.g.op("Add", [h, self._norm(right, p + "laurel.post_laurel_norm")])

    def _last_tokens(self, x: str, delta: str | None) -> str:
        """Each row's last valid token of the stream [B, hidden] (and of the per-layer
        inputs), before the KV-shared layers: their KV is an earlier layer's, so what they
        compute for the other tokens reaches no cache nor the LM head (shared_kv.py)."""
        x = x if delta is None else self.g.op("Add", [x, delta])
        if self.ple is not None:
            self.ple.keep_last()
        return self.tokens.last(x)

    def _layer_tail(self, i: int, x: str, delta: str | None,
                    rows: Rows) -> tuple[str, str | None]:
        """Gemma 4: after the MLP's residual add, the layer's per-layer input and its
        scalar (x times `layer_scalar`); other families' layers end at the MLP (Gemma 3n's
        add their per-layer input to the AltUp streams themselves)."""
        if (self.ple is None or self.altup is not None) and not self.cfg.spec.layer_scalar:
            return x, delta
        p = self.names.layer.format(i=i)
        x = x if delta is None else self.g.op("Add", [x, delta])
        if self.ple is not None:
            x = self.g.op("Add", [x, self.ple.layer(p, x, i, rows)])
        if self.cfg.spec.layer_scalar:
            x = self.g.op("Mul", [x, self.w.tensor(p + "layer_scalar")])
        return x, None

    def _flavor_for(self, cfg: ModelConfig) -> Flavor:
        """The flavour of a layer seen as `cfg` (ModelConfig.for_layer): the build's own,
        or one of the same kind for a layer with head counts or a head size of its own."""
        if cfg is self.cfg:
            return self.flavor
        key = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.rotary_dim)
        if key not in self._flavors:
            self._flavors[key] = type(self.flavor)(cfg, self.dtype, self.flavor.max_context)
        return self._flavors[key]

    def _latent_for(self, cfg: ModelConfig) -> LatentAttention:
        """The latent attention of the layers seen as `cfg` (ModelConfig.for_layer: dots.3's
        sliding layers have latent sizes and heads of their own), one per shape."""
        assert cfg.latent is not None
        key = (cfg.latent, cfg.num_heads)
        if key not in self._latents:
            self._latents[key] = LatentAttention(self, cfg, self._flavor_for(cfg), self.indexer)
        return self._latents[key]

    def _hybrid_mixers(self, i: int, h: str, step: StepTensors, rows: Rows) -> str:
        """Falcon-H1's mixers of layer i on its normed input `h`: attention of
        h x attention_in times attention_out plus Mamba-2 times ssm_out (the mixer scales
        its own input)."""
        g, scales = self.g, self.cfg.scales
        assert scales is not None and self.mamba is not None
        attn = self._attention(i, self._times(h, scales.attention_in), step, rows)
        mamba = self.mamba.layer(self.names.layer.format(i=i), h, i, rows)
        return g.op("Add", [self._times(attn, scales.attention_out),
                            self._times(mamba, scales.ssm_out)])

    def _times(self, x: str, factor: float) -> str:
        """x times a constant (nothing where it is 1)."""
        return x if factor == 1.0 else self.g.op("Mul", [x, self.g.const(factor, self.dtype)])

    def _scaled(self, sublayer: str) -> str:
        """A sublayer's output times the residual multiplier (Granite), before the add."""
        return self._times(sublayer, self.cfg.residual_scale)

    def _depth_scaled(self, x: str, sublayer: str, add: int) -> tuple[str, str]:
        """Beam's `add`-th residual add of the stack (FamilySpec.depth_scaled_residual):
        x and the sublayer's output to be added, scaled as its model scales them; as they
        are elsewhere."""
        if not self.cfg.spec.depth_scaled_residual:
            return x, sublayer
        return (self._times(x, math.sqrt((add - 1) / add)),
                self._times(sublayer, 1.0 / math.sqrt(add)))

    def _residual_gated(self, x: str, sublayer: str, m: str) -> tuple[str, str]:
        """Muse Spark's residual gate `m` (FamilySpec.residual_gate_key): x and the
        sublayer's output to be added, times a and b per channel, both of the stored gate
        (export/residual_gate.py); as they are elsewhere."""
        if self.cfg.residual_gate_temperature is None:
            return x, sublayer
        name = m + ".gate"
        width = self.cfg.hidden_size
        self.w.check_shapes([(name, (width,))], f"hidden {width}")
        a, b = (self.g.weight(f"{name}.{part}", (width,), self.dtype, read) for part, read in
                residual_gate_factors(self.ckpt, name, self.cfg.residual_gate_temperature,
                                      self.dtype))
        return self.g.op("Mul", [x, a]), self.g.op("Mul", [sublayer, b])

    def _mixer(self, i: int, h: str, step: StepTensors, rows: Rows) -> str:
        """The layer's token mixer: attention, LFM2's short convolution, Qwen3.5's Gated
        DeltaNet or a Mamba-2 mixer."""
        if i in self.cfg.state_layers:
            return self._mixer_of(i).layer(self.names.layer.format(i=i), h, i, rows)
        return self._attention(i, h, step, rows)

    def _attention(self, i: int, h: str, step: StepTensors, rows: Rows) -> str:
        n, layer = self.names, self.cfg.layers[i]
        cfg = self.cfg.for_layer(i)  # this layer's head size, query and KV heads
        p = n.layer.format(i=i)
        if cfg.latent is not None:  # DeepSeek's MLA: its own projections and cache layout
            latent = self._latent_for(cfg)
            return self._output(p, latent.attention(p, h, i, step, layer, rows),
                                cfg.num_heads, cfg.latent.v_dim)
        if i in cfg.shared_kv:  # Gemma 4: [B, hidden], queries over an earlier layer's KV
            assert self.shared is not None
            q = self._shared_query(p, h, cfg)
            return self._output(p, self.shared.attention(q, cfg, layer,
                                                         kv_names(cfg.shared_kv[i])),
                                cfg.num_heads, cfg.head_dim)
        if self.moa is not None:  # JetMoE: routed queries over shared keys and values
            return self._routed_heads(p, i, h, step, rows)
        if self.blocks is not None and i in self.blocks.shape.layers:  # MiniMax-M3: the
            # model's heads (`cfg` counts the index key's head and its query heads too)
            return self._output(p, rows(self.blocks.attention(p, h, i, step, layer)),
                                self.cfg.num_heads, self.cfg.head_dim)
        if self.cca is not None:  # ZAYA: [B, C, ...] already, and L2-normed
            q, k, v = self._cca_qkv(p, h, i, cfg)
            gate = None
        else:
            q, k, v, gate = self._qkv(p, h, cfg, layer, cfg.k_eq_v and layer.window is None)
            q, k, v = (t if t is None else self.tokens.spread(t) for t in (q, k, v))
        if cfg.qk_norm == "head_rotated":
            q, k = self._rotated_head_norms(p, q, k, step, layer)
            layer = replace(layer, rope=None)  # attention takes q and k rotated
        names = kv_names(i)
        past = (names.past_key, names.past_value)
        present = (names.present_key, names.present_value)
        if cfg.spec.differential:
            attn = self._differential(p, i, (q, k, v), past, present, step, layer)
            return self._output(p, rows(attn), cfg.num_heads, cfg.head_dim)
        has_sinks = cfg.spec.sinks and (layer.window or not cfg.spec.sliding_sinks_only)
        sink = self.layer_sinks(p, cfg) if has_sinks else None
        dynamic = self._dynamic_mask(p, cfg) if cfg.keep_window is not None else None
        attn = self._flavor_for(cfg).attention(self.g, q, k, v, past, present, step, layer,
                                               sink, dynamic)
        attn = self.tokens.gather(attn, cfg.num_heads * cfg.head_dim)
        if cfg.v_head_dim is not None:  # MiMo-V2-Flash: each head's values, unpadded
            attn = cut_values(self.g, attn, cfg.num_heads, cfg.v_head_dim, cfg.head_dim)
        if cfg.spec.out_norm_weightless:  # Muse Spark: each head's output, before its gate
            attn = self._l2_norm(attn, cfg.num_heads)
        if cfg.head_gate:
            attn = self._head_gated(p, h, attn, cfg)
        attn = rows(attn)
        if gate is not None:  # Qwen3.5: the attention's output times sigmoid(gate)
            attn = self.g.op("Mul", [attn, self.g.op("Sigmoid", [rows(gate)])])
        return self._output(p, attn, cfg.num_heads, cfg.v_head_dim or cfg.head_dim)

    def _routed_heads(self, p: str, i: int, h: str, step: StepTensors, rows: Rows) -> str:
        """JetMoE: grouped-query attention of each token's routed query heads over the
        shared KV heads, each slot's output through its expert (mixture_attention.py)."""
        assert self.moa is not None
        cfg, names = self.cfg, kv_names(i)
        q = self.moa.queries(p, h)
        k, v = self.moa.keys_values(p, h)
        q, k, v = (self.tokens.spread(t) for t in (q, k, v))
        attn = self._flavor_for(cfg).attention(
            self.g, q, k, v, (names.past_key, names.past_value),
            (names.present_key, names.present_value), step, cfg.layers[i])
        attn = self.tokens.gather(attn, cfg.num_heads * cfg.head_dim)
        return self.moa.output(p, rows(h), rows(attn))

    def _differential(self, p: str, i: int, qkv: tuple[str | None, ...],
                      past: tuple[str, str], present: tuple[str, str], step: StepTensors,
                      layer: LayerAttention) -> str:
        """DiffLlama: the layer's differential attention [.., H*D] before o_proj, its lambda
        from the layer's lambda vectors (export/differential.py)."""
        cfg = self.cfg
        q, k, v = qkv
        assert q is not None and k is not None and v is not None  # _qkv splits them
        names = [p + name for name in differential.LAMBDAS]
        self.w.check_shapes([(name, (cfg.head_dim,)) for name in names],
                            f"head_dim {cfg.head_dim}")
        lam = differential.lambda_full(*(self.ckpt.get(name) for name in names), i,
                                       self.dtype)
        width = cfg.num_heads * cfg.head_dim
        own, other = (self.tokens.gather(t, width) for t in self._flavor_for(cfg)
                      .differential_attention(self.g, q, k, v, past, present, step, layer))
        return differential.difference(self.g, self.flavor, own, other, cfg.num_heads,
                                       cfg.head_dim, lam, i)

    def _cca_qkv(self, p: str, h: str, i: int, cfg: ModelConfig) -> tuple[str, str, str]:
        """ZAYA's q, k and v [B, C, ...] from CCA's projection (export/cca.py), q and k
        through ZayaQKNorm (the keys times the layer's `temp` per KV head)."""
        assert self.cca is not None
        q, k, v = self.cca.qkv(p, h, i, cfg.qkv_bias)
        temp = p + "self_attn.qk_norm.temp"
        self.w.check_shapes([(temp, (cfg.num_kv_heads,))], f"{cfg.num_kv_heads} KV heads")
        return (qk_normed(self.g, q, cfg.num_heads, cfg.head_dim, self.dtype),
                qk_normed(self.g, k, cfg.num_kv_heads, cfg.head_dim, self.dtype,
                          self.w.tensor(temp)), v)

    def layer_sinks(self, p: str, cfg: ModelConfig) -> str:
        """gpt-oss, Hy4 (its latent attention): the layer's sink logit per query head, [H]."""
        name = p + self.names.sinks
        if self.w.shape(name) != (cfg.num_heads,):
            raise ExportError(f"{name} has shape {self.w.shape(name)}, but config.json "
                              f"implies ({cfg.num_heads},) (one sink per query head)")
        return self.w.tensor(name)

    def _dynamic_mask(self, p: str, cfg: ModelConfig) -> DynamicMask:
        """Doge: the layer's dt_proj [KV, KV*D] (its bias where attention_bias) and A [KV]
        (export/dynamic_mask.py), kept float in a quantized bundle (a few numbers per key,
        which pick the keys). No top-k where the bundle's context is within
        keep_window_size: no call has more keys."""
        kv, width = cfg.num_kv_heads, cfg.num_kv_heads * cfg.head_dim
        dt, a = p + "self_attn.dt_proj", p + "self_attn.A"
        implied = f"{kv} KV heads of {cfg.head_dim}"
        self.w.check_shapes([(dt + ".weight", (kv, width)), (a, (kv,))], implied)
        if cfg.qkv_bias:
            self.w.check_shapes([(dt + ".bias", (kv,))], implied)
        keep = cfg.keep_window
        assert keep is not None
        return DynamicMask(self.w.tensor(dt + ".weight"),
                           self.w.tensor(dt + ".bias") if cfg.qkv_bias else None,
                           self.w.tensor(a), keep if self.flavor.max_context > keep else None)

    def _head_gated(self, p: str, h: str, attn: str, cfg: ModelConfig) -> str:
        """LFM3: attention's output [B,C,H*D] (or packed [1,T,H*D]), each head's D values
        times sigmoid of that head's gate, g_proj of the layer's normed input `h`. Beam
        (FamilySpec.channel_gate): a gate per channel, gate_proj plus its head's bias.
        Laguna (FamilySpec.softplus_gate): softplus of the gate, per head or per channel
        (ModelConfig.gate_per_channel), in float32 as LagunaAttention computes it. Step 3.7
        (FamilySpec.sigmoid_gate): Laguna's gate through sigmoid."""
        g, heads, dim = self.g, cfg.num_heads, cfg.head_dim
        width = dim if cfg.gate_per_channel else 1  # gates per head
        name = self.w.resolve(tuple(p + gate + ".weight" for gate in self.names.head_gate))
        if self.w.shape(name) != (heads * width, cfg.hidden_size):
            raise ExportError(
                f"{name} has shape {self.w.shape(name)}, but config.json implies "
                f"{(heads * width, cfg.hidden_size)} ({heads} heads of {width} gates, hidden "
                f"{cfg.hidden_size})")
        gate = g.op("Reshape", [self.w.linear(h, [name], None), g.const([0, 0, heads, width])])
        if cfg.spec.channel_gate:
            bias = self.w.tensor(p + self.names.head_gate_bias)  # [H], broadcast over D
            gate = g.op("Add", [gate, g.op("Unsqueeze", [bias, g.const([-1])])])
        per_head = g.op("Reshape", [attn, g.const([0, 0, heads, dim])])
        gated = g.op("Mul", [per_head, self._gate_activation(gate)])
        return g.op("Reshape", [gated, g.const([0, 0, heads * dim])])

    def _gate_activation(self, gate: str) -> str:
        """sigmoid(gate); Laguna's softplus(gate), computed in float32 and cast back."""
        g = self.g
        if not self.cfg.spec.softplus_gate:
            return g.op("Sigmoid", [gate])
        if self.dtype == np.float32:
            return g.op("Softplus", [gate])
        return g.op("Cast", [g.op("Softplus", [g.op("Cast", [gate], to=1)])],
                    to=int(np_dtype_to_tensor_dtype(self.dtype)))

    def _output(self, p: str, attn: str, heads: int, values: int) -> str:
        """The attention's output projection (after BitNet's sub-norm) of attn [.., heads *
        values]: the layer's query heads (its own where heads differ by layer), each head's
        values (head_dim; MiMo-V2-Flash's and MLA's v_head_dim)."""
        if self.names.attn_sub_norm is not None:
            attn = self._norm(attn, p + self.names.attn_sub_norm)
        o = p + self.names.o
        self.w.check_output(o + ".weight", heads, values, self.cfg.hidden_size)
        out = self.w.linear(attn, [o + ".weight"], o + ".bias" if self.cfg.o_bias else None)
        extra = self.names.o_extra_bias
        if extra is not None and self.ckpt.has(p + extra):  # GPT-NeoX Japanese's last layer
            self.w.check_bias(p + extra, self.cfg.hidden_size,
                              f"config.json's hidden_size {self.cfg.hidden_size}")
            out = self.g.op("Add", [out, self.w.tensor(p + extra)])
        return out

    def _shared_query(self, p: str, h: str, cfg: ModelConfig) -> str:
        """A KV-shared layer's q [B,1,H*D] from h [B,hidden] (each row's last token): its
        projection and per-head norm (Gemma 4)."""
        name = p + self.names.q + ".weight"
        expected = (cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        if self.w.shape(name) != expected:
            raise ExportError(f"{name} has shape {self.w.shape(name)}, but config.json "
                              f"implies {expected}")
        q = self.w.linear(h, [name], p + self.names.q + ".bias" if cfg.qkv_bias else None)
        q = self.g.op("Unsqueeze", [q, self.g.const([1])])  # [B,1,H*D]: one token per row
        return self._head_norm(q, cfg.num_heads, p + self.names.q_norm, cfg.head_dim)

    def _qkv(self, p: str, h: str, cfg: ModelConfig, layer: LayerAttention,
             k_is_v: bool = False) -> list[str | None]:
        """One packed projection for q, k and v (and the output gate where the family has
        one, else None as the fourth). Flavours whose attention takes the packed tensor get
        it whole ([qkv, None, None, None]: no split copies); otherwise it is split, with
        q/k norms where the family has them and q times its factor (Ministral 3). `cfg` is
        the layer's (ModelConfig.for_layer), `layer` its attention; `k_is_v`: the layer has
        no v_proj, its values are its keys' projection (Gemma 4's attention_k_eq_v)."""
        g, n = self.g, self.names
        parts = [n.qkv] if n.qkv else [n.q, n.k] if k_is_v else [n.q, n.k, n.v]
        if cfg.attn_gate and n.attn_gate is not None:  # AFMoE: the gate's own projection
            parts.append(n.attn_gate)
        weights = [p + part + ".weight" for part in parts]
        bias = p + (n.qkv or "self_attn.qkv_proj") + ".bias" if cfg.qkv_bias else None
        self._check_qkv_shapes(weights, cfg)
        reorder = self._neox_order if cfg.spec.qkv_interleaved or cfg.qkv_layout == "heads" \
            else self._group_order if cfg.qkv_layout == "groups" else \
            self._shard_order if cfg.spec.qkv_shards else \
            self._gate_last if cfg.attn_gate and n.attn_gate is None else \
            self._reflected if cfg.spec.rotary_reflected else None
        qkv = self._scaled_keys(self.w.linear(h, weights, bias, reorder=reorder))
        if cfg.clip_qkv is not None:  # OLMo 1
            bound = cfg.clip_qkv
            qkv = g.op("Clip", [qkv, g.const(-bound, self.dtype), g.const(bound, self.dtype)])
        l2_norm = cfg.qk_norm == "l2" and layer.rope is not None  # Llama 4: rope layers
        q_scale = self.layer_query_scale(layer)
        own_values = cfg.v_head_dim is not None or cfg.value_scale != 1.0
        if self.flavor.packed_qkv and cfg.qk_norm in (None, "l2") and not l2_norm \
                and q_scale is None and not cfg.attn_gate and not k_is_v and not own_values \
                and cfg.keep_window is None and not cfg.spec.differential:  # these read v
            return [qkv, None, None, None]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        gate = None
        if cfg.attn_gate:
            q, k, v, gate = g.op("Split", [qkv, g.const([q_size, kv_size, kv_size, q_size])],
                                 4, axis=-1)
        elif k_is_v:
            q, k = g.op("Split", [qkv, g.const([q_size, kv_size])], 2, axis=-1)
            v = k  # the keys' projection, before their norm and rotary
        else:
            v_size = cfg.num_kv_heads * (cfg.v_head_dim or cfg.head_dim)
            q, k, v = g.op("Split", [qkv, g.const([q_size, kv_size, v_size])], 3, axis=-1)
        if own_values:  # MiMo-V2-Flash
            v = self._own_values(v, cfg)
        if cfg.spec.v_norm:  # Gemma 4: per head, without weight
            ones = g.const(np.ones(cfg.head_dim), self.dtype)
            per_head = g.op("Reshape", [v, g.const([0, 0, cfg.num_kv_heads, cfg.head_dim])])
            v = g.op("Reshape", [self.flavor.rms_norm(g, per_head, ones),
                                 g.const([0, 0, cfg.num_kv_heads * cfg.head_dim])])
        if cfg.qk_norm == "head":
            q = self._head_norm(q, cfg.num_heads, p + n.q_norm, cfg.head_dim)
            k = self._head_norm(k, cfg.num_kv_heads, p + n.k_norm, cfg.head_dim)
        elif cfg.qk_norm == "full":
            self._check_norm_width(p + n.q_norm, cfg.num_heads * cfg.head_dim)
            self._check_norm_width(p + n.k_norm, cfg.num_kv_heads * cfg.head_dim)
            q, k = self._norm(q, p + n.q_norm), self._norm(k, p + n.k_norm)
        elif cfg.qk_norm == "head_affine":  # Chameleon
            q = self._head_affine(q, cfg.num_heads, p + n.q_norm)
            k = self._head_affine(k, cfg.num_kv_heads, p + n.k_norm)
        elif l2_norm or cfg.qk_norm == "weightless":  # Llama 4's, Muse Glimmer's: before
            # rotary (which keeps each head's length: FamilySpec.qk_norm)
            q, k = self._l2_norm(q, cfg.num_heads), self._l2_norm(k, cfg.num_kv_heads)
        if q_scale is not None:  # before rotary, which it commutes with (query_scale.py)
            q = g.op("Mul", [q, q_scale])
        return [q, k, v, gate]

    def layer_query_scale(self, layer: LayerAttention) -> str | None:
        """The query factor of this layer: Ministral 3's on all, Llama 4's on NoPE ones."""
        scale = self.cfg.query_scale
        if scale is None or (scale.nope_only and layer.rope is not None):
            return None
        return self.q_scale

    def _head_affine(self, x: str, heads: int, name: str) -> str:
        """Chameleon's norm of q or k [B,C,heads*D]: per head, its weight and bias the
        head's own, stored [heads, D] (export/head_affine_norm.py)."""
        d = self.cfg.head_dim
        self.w.check_shapes([(name + ".weight", (heads, d)), (name + ".bias", (heads, d))],
                            f"{heads} heads of {d}")
        return head_affine_norm(self.g, self.flavor, x, heads, d,
                                self.w.tensor(name + ".weight"), self.w.tensor(name + ".bias"))

    def _l2_norm(self, x: str, heads: int) -> str:
        """Llama 4's L2 norm (Muse Glimmer's q/k norm): each head of x [B,C,heads*D]
        RMS-normed without weight."""
        g, d = self.g, self.cfg.head_dim
        per_head = g.op("Reshape", [x, g.const([0, 0, heads, d])])
        return g.op("Reshape", [self._weightless_norm(per_head, d),
                                g.const([0, 0, heads * d])])

    def _weightless_norm(self, x: str, width: int, eps: float | None = None) -> str:
        """x RMS-normed over its last axis (`width` wide) without weight (at its own `eps`
        where given)."""
        return self.flavor.rms_norm(self.g, x, self.g.const(np.ones(width), self.dtype), eps)

    def _rotated_head_norms(self, p: str, q: str, k: str, step: StepTensors,
                            layer: LayerAttention) -> tuple[str, str]:
        """HunYuan: q [B,C,H*D] and k [B,C,KV*D] rotated, then each head RMS-normed. The
        rotary goes outside attention (GroupQueryAttention would rotate after the norm)."""
        cfg, n = self.cfg, self.names
        if layer.rope is not None:
            q, k = self.flavor.rotary(self.g, q, k, step, layer.rope)
        return (self._head_norm(q, cfg.num_heads, p + n.q_norm),
                self._head_norm(k, cfg.num_kv_heads, p + n.k_norm))

    def _own_values(self, v: str, cfg: ModelConfig) -> str:
        """MiMo-V2-Flash's values: times attention_value_scale, each head padded from
        v_head_dim to head_dim for the cache (export/value_heads.py)."""
        if cfg.value_scale != 1.0:
            v = self.g.op("Mul", [v, self.g.const(cfg.value_scale, self.dtype)])
        if cfg.v_head_dim is None:
            return v
        return pad_values(self.g, v, cfg.num_kv_heads, cfg.v_head_dim, cfg.head_dim)

    def _check_qkv_shapes(self, weights: list[str], cfg: ModelConfig) -> None:
        """A checkpoint that disagrees with its config.json fails here, in one line, not
        as a reshape error inside ONNX Runtime."""
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        gated = int(cfg.attn_gate and self.names.attn_gate is not None)  # its own, last
        v = cfg.num_kv_heads * (cfg.v_head_dim or cfg.head_dim)
        q *= 2 if cfg.attn_gate and not gated else 1  # each head's query and its output gate
        plain = len(weights) - gated  # one fused qkv, or q and k (and v)
        expected = [(q + kv + v, cfg.hidden_size)] if plain == 1 else [
            (q, cfg.hidden_size), *[(kv, cfg.hidden_size)] * (plain - 2),
            (v if plain == 3 else kv, cfg.hidden_size)]
        expected += [(q, cfg.hidden_size)] * gated
        for name, shape in zip(weights, expected, strict=True):
            if self.w.shape(name) != shape:
                raise ExportError(
                    f"{name} has shape {self.w.shape(name)}, but config.json implies {shape} "
                    f"({cfg.num_heads} heads, {cfg.num_kv_heads} KV heads of {cfg.head_dim}, "
                    f"hidden {cfg.hidden_size})"
                )

    def _neox_order(self, rows: np.ndarray) -> np.ndarray:
        """GPT-NeoX stores the fused projection's rows as [head, q|k|v, dim]; the graph
        wants [q|k|v, head, dim]."""
        d, heads = self.cfg.head_dim, self.cfg.num_heads
        rest = rows.shape[1:]
        return rows.reshape(heads, 3, d, *rest).swapaxes(0, 1).reshape(3 * heads * d, *rest)

    def _group_order(self, rows: np.ndarray) -> np.ndarray:
        """Falcon's new decoder architecture stores the fused projection's rows per KV head:
        [KV head, its heads / KV queries | k | v, dim]; the graph wants [q|k|v, head, dim]
        (a query head's KV head is then its group's, as transformers broadcasts it)."""
        d, heads, kv = self.cfg.head_dim, self.cfg.num_heads, self.cfg.num_kv_heads
        rest = rows.shape[1:]
        groups = rows.reshape(kv, heads // kv + 2, d, *rest)
        return np.concatenate([groups[:, :-2].reshape(heads * d, *rest),
                               groups[:, -2].reshape(kv * d, *rest),
                               groups[:, -1].reshape(kv * d, *rest)])

    def _shard_order(self, rows: np.ndarray) -> np.ndarray:
        """CodeGen stores the fused projection's rows as [shard, q|v|k, hidden / shards]
        (the model-parallel layout it was trained in, CodeGenAttention's mp_num); each of
        q, k and v is its shards' slices in order. The graph wants [q|k|v, hidden]."""
        shards, hidden = self.cfg.spec.qkv_shards, self.cfg.hidden_size
        rest = rows.shape[1:]
        parts = rows.reshape(shards, 3, hidden // shards, *rest)
        return np.concatenate([parts[:, j].reshape(hidden, *rest) for j in (0, 2, 1)])

    def _scaled_keys(self, qkv: str) -> str:
        """Falcon-H1 multiplies k by key_multiplier after its projection (bias included):
        the packed q|k|v times 1|key_multiplier|1. (Folded into k's weights instead, an
        int4 bundle drifted 0.02 from transformers with the dequantized weights.)"""
        cfg = self.cfg
        if cfg.scales is None or cfg.scales.key == 1.0:
            return qkv
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        factors = np.concatenate([np.ones(q), np.full(kv, cfg.scales.key), np.ones(kv)])
        return self.g.op("Mul", [qkv, self.g.const(factors, self.dtype)])

    def _reflected(self, rows: np.ndarray) -> np.ndarray:
        """nanochat: q's and k's rows of each head's rotated second half negated
        (FamilySpec.rotary_reflected); v's as they are."""
        cfg = self.cfg
        signs = np.ones(cfg.head_dim, np.float32)
        signs[cfg.rotary_dim // 2 : cfg.rotary_dim] = -1.0
        factors = np.concatenate([np.tile(signs, cfg.num_heads), np.tile(signs, cfg.num_kv_heads),
                                  np.ones(cfg.num_kv_heads * cfg.head_dim, np.float32)])
        return rows * factors.reshape(-1, *[1] * (rows.ndim - 1))

    def _gate_last(self, rows: np.ndarray) -> np.ndarray:
        """Qwen3.5 stores q_proj's rows as [head, query|gate, dim] above k and v; the
        graph wants [query (head, dim), k, v, gate (head, dim)]."""
        d, heads = self.cfg.head_dim, self.cfg.num_heads
        rest = rows.shape[1:]
        both = rows[: 2 * heads * d].reshape(heads, 2, d, *rest)
        query, gate = (both[:, i].reshape(heads * d, *rest) for i in (0, 1))
        return np.concatenate([query, rows[2 * heads * d :], gate])

    def _head_norm(self, x: str, heads: int, name: str, d: int | None = None) -> str:
        g, d = self.g, d or self.cfg.head_dim
        self._check_norm_width(name, d)
        per_head = g.op("Reshape", [x, g.const([0, 0, heads, d])])
        normed = self._norm(per_head, name, d)
        return g.op("Reshape", [normed, g.const([0, 0, heads * d])])

    def _norm(self, x: str, name: str, width: int | None = None, eps: float | None = None,
              kind: str | None = None) -> str:
        """The family's norm over the last axis (`width` wide: hidden unless given); `name`
        is the module (".weight" added). An RMSNorm's own `eps` and a norm of another
        `kind` (of NORMS) where given (Muse Glimmer's post-sublayer and final norms)."""
        norm = kind or self.cfg.norm
        if norm == "rms_input_scaled":  # Muse Spark's: x * (1 + w), then normed
            x = self.g.op("Mul", [x, self._norm_weight(name, width, "rms_plus_one")])
            return self._weightless_norm(x, width or self.cfg.hidden_size, eps)
        if norm in LAYER_NORMS:
            bias = self.w.tensor(name + ".bias") if norm not in UNBIASED else None
            return self.flavor.layer_norm(self.g, x, self._norm_weight(name, width, norm),
                                          bias)
        return self.flavor.rms_norm(self.g, x, self._norm_weight(name, width, norm), eps)

    def _add_norm(self, x: str, delta: str | None, name: str) -> tuple[str, str]:
        """(x + delta, norm(x + delta)); delta None adds nothing. A.X K2's gated norms
        (FamilySpec.gated_norms) times their gate."""
        if self.cfg.spec.gated_norms and self.ckpt.has(name + ".mlp.fc1.weight"):
            x, h = self.flavor.add_rms_norm(self.g, x, delta,
                                            self._norm_weight(name + ".norm"))
            return x, self._norm_gate(name + ".mlp.", h)
        if self.cfg.norm in LAYER_NORMS:
            x = x if delta is None else self.g.op("Add", [x, delta])
            return x, self._norm(x, name)
        return self.flavor.add_rms_norm(self.g, x, delta, self._norm_weight(name))

    def _norm_gate(self, m: str, h: str) -> str:
        """h times sigmoid(fc2(silu(fc1(h)))), the sigmoid in float32 and cast back
        (AXK2GatedRMSNorm); fc1 and fc2 (a rank-`gated_norm_rank` bottleneck) quantized as
        any projection."""
        g = self.g
        gate = self._activation(self.w.linear(h, [m + "fc1.weight"], None), "silu")
        gate = self.w.linear(gate, [m + "fc2.weight"], None)
        if self.dtype != np.float32:
            gate = g.op("Cast", [g.op("Sigmoid", [g.op("Cast", [gate], to=1)])],
                        to=int(np_dtype_to_tensor_dtype(self.dtype)))
        else:
            gate = g.op("Sigmoid", [gate])
        return g.op("Mul", [h, gate])

    def _check_norm_width(self, name: str, width: int) -> None:
        """A q/k norm's stored weight is `width` wide (per head or over the projection, as
        the config says): one the config disagrees with (another q/k norm kind, head size
        or head count) fails at export in one line, not at the bundle's first call."""
        if self.cfg.norm not in WEIGHTLESS:
            self.w.check_shapes([(name + ".weight", (width,))],
                                f"the q/k norm over {width} values")

    def _norm_weight(self, name: str, width: int | None = None, kind: str | None = None) -> str:
        """The weight a norm of `kind` (the model's unless given) multiplies by."""
        kind = kind or self.cfg.norm
        if kind in WEIGHTLESS:  # statistics only (OLMo 1, nanochat)
            return self.g.const(np.ones(width or self.cfg.hidden_size), self.dtype)
        if kind not in ("rms_plus_one", "layer_plus_one"):
            return self.w.tensor(name + ".weight")
        # Gemma and Nemotron scale by (1 + w), computed in float32 as transformers does.
        stored = name + ".weight"
        return self.g.weight(
            name + ".weight_plus_one", self.w.shape(stored), self.dtype,
            lambda: (1.0 + self.ckpt.get(stored, np.float32)).astype(self.dtype),
        )

    def _mlp(self, p: str, h: str, rows: Rows = _every_token) -> str:
        """The layer's MLP, or its experts; `rows`: the tokens `h` holds of the layer's
        input (ZAYA's router carries its state from the layer before, cut to them)."""
        if p in self.expert_layers:
            assert self.experts is not None
            if self.router is None:
                return self._moe_output_norm(p, self.experts.block(p, h))
            self.router.keep_rows(rows)
            return self.experts.routed(p, h, *self.router.route(p, h))
        return self._dense_mlp(p, h)

    def _dense_mlp(self, p: str, h: str) -> str:
        """The layer's dense MLP on h."""
        g, n, cfg = self.g, self.names, self.cfg
        bias = cfg.mlp_bias
        if not cfg.spec.gated_mlp:
            self.w.check_mlp([p + n.up + ".weight"], p + n.down + ".weight", gated=False)
            up = self.w.linear(h, [p + n.up + ".weight"], p + n.up + ".bias" if bias else None)
            act = self._mlp_activation(p, up)
            return self.w.linear(act, [p + n.down + ".weight"],
                                p + n.down + ".bias" if bias else None)
        # One packed projection: a decode step is dominated by per-kernel overhead, so one
        # MatMul and a split beat two MatMuls (int4 decode ~10% faster, measured); in a
        # prefill chunk the split's copy costs ~1%.
        parts = [n.gate_up] if n.gate_up else [n.gate, n.up]
        if n.gate_up and stored_apart(self.ckpt, p + n.gate_up, p + n.gate):
            parts = [n.gate, n.up]
        # the packed bias (RecurrentGemma's): its parts' biases, concatenated (weights.py)
        packed_bias = p + parts[0] + ".bias" + ("" if len(parts) == 1 else ".packed")
        self.w.check_mlp([p + part + ".weight" for part in parts], p + n.down + ".weight",
                         gated=True)
        gate_up = self.w.linear(h, [p + part + ".weight" for part in parts],
                                packed_bias if bias else None)
        gate, up = g.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        if cfg.spec.up_first and n.gate_up:  # Molmo 2's ff_proj: [up | gate]
            gate, up = up, gate
        if p in self.sparse_layers:  # Gemma 3n
            gate = sparse_gate(g, gate, self.sparse_layers[p], self.dtype)
        gate_scale, down_scale = cfg.scales.mlp if cfg.scales is not None else (1.0, 1.0)
        act = clamped_glu(g, self._times(gate, gate_scale),
                          lambda x: self._mlp_activation(p, x), up,
                          self.clamps.get(p, (None, None))[1], self.dtype)
        if n.mlp_sub_norm is not None:  # BitNet
            act = self._norm(act, p + n.mlp_sub_norm)
        down = self.w.linear(act, [p + n.down + ".weight"], p + n.down + ".bias" if bias else None)
        return self._times(down, down_scale)

    def _moe_output_norm(self, p: str, out: str) -> str:
        """The experts' output, normed where the family norms it (A.X K1's
        post_mlp_layernorm, MoeNames.output_norm)."""
        spec = self.cfg.spec.moe
        names = spec.names.output_norm if spec is not None else ()
        if not names:
            return out
        found = self.w.resolve(tuple(p + name + ".weight" for name in names))
        return self._norm(out, found.removesuffix(".weight"))

    def _mlp_activation(self, p: str, x: str) -> str:
        """The activation of layer `p`'s dense MLP: xIELU reads the layer's own alphas."""
        if self.cfg.activation == "xielu":
            return xielu(self.g, self.ckpt, x, p + self.names.act, self.dtype)
        return self._activation(x)

    def _activation(self, x: str, kind: str | None = None) -> str:
        """x through `kind` (a value of ACTIVATIONS; the model's MLP's unless given)."""
        g, kind = self.g, kind or self.cfg.activation
        if kind == "xielu":  # its weights are a dense MLP's (_mlp_activation)
            raise ExportError("the xielu activation is supported in dense MLPs only")
        if kind == "silu":
            return g.op("Mul", [x, g.op("Sigmoid", [x])])
        if kind == "relu":  # OPT, CTRL, GPT-1's afn "relu"
            return g.op("Relu", [x])
        if kind == "relu2":  # Arcee (transformers' ReLUSquaredActivation)
            relu = g.op("Relu", [x])
            return g.op("Mul", [relu, relu])
        return g.op("Gelu", [x], approximate="tanh" if kind == "gelu_tanh" else "none")

    def _logits(self, logits: str) -> str:
        """Cohere's logit scale, Granite's logits scaling, Gemma 2's final soft-cap
        (c * tanh(logits / c)) and Chameleon's masked image tokens."""
        g, cfg = self.g, self.cfg
        if cfg.logits_multiplier != 1.0:
            logits = g.op("Mul", [logits, g.const(cfg.logits_multiplier, self.dtype)])
        if cfg.logits_divisor != 1.0:
            logits = g.op("Div", [logits, g.const(cfg.logits_divisor, self.dtype)])
        if cfg.final_softcap is not None:
            cap = g.const(cfg.final_softcap, self.dtype)
            logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, cap])]), cap])
        if cfg.masked_tokens:  # Chameleon's image tokens (export/masked_logits.py)
            logits = masked(g, logits, cfg.masked_tokens, cfg.vocab_size, self.dtype)
        return logits

    def _embed(self, ids: str) -> str:
        """The tokens' rows of the embedding table: quantized with the weights where the
        table is its own; a tied one stays float unless QuantConfig.tied_embeddings
        (quantize.py's docstring says why)."""
        name = embedding_weight(self.ckpt, self.cfg)
        self._check_vocab_shape(name, self.cfg.embed_extra_rows)
        # an embedding bundle has no LM head: its table is its own
        untied = self.embed or head_weight(self.ckpt, self.cfg) != name
        quantize = untied or (self.quant is not None and self.quant.tied_embeddings)
        return self.w.rows(name, self.tokens.indices(ids), quantize=quantize)

    def _position_embedding(self, past_lens: str, chunk: str) -> str:
        """Each token's row of the position table (GPT-2's learned `wpe`, XGLM's or CTRL's
        sinusoids), as the tokens are laid out. Every position a call computes, its padding
        included, lies below the KV capacity, which is at most the bundle's context
        (Engine._capacity), which is at most the table's rows (exporter._max_context)."""
        at = positions(self.g, self.g.op("Cast", [past_lens], to=7), chunk)  # [B,C]
        return self.tokens.embed(self._position_table(), at)

    def _position_table(self) -> str:
        """[max_positions, hidden] from position 0: the stored table from its row `offset`
        on (OPT's 2), or XGLM's or CTRL's sinusoidal table computed here (sinusoids.py),
        as long as the bundle's context (each row depends on its position alone; a table of
        the config's max_position_embeddings could be any size: 2**40 rows had been a
        MemoryError)."""
        g, cfg = self.g, self.cfg
        offset = cfg.spec.position_offset
        shape = (cfg.max_positions, cfg.hidden_size)
        computed = (min(cfg.max_positions, self.flavor.max_context), cfg.hidden_size)
        if cfg.spec.sinusoidal_positions == "xglm":
            return g.weight("sinusoidal_positions", computed, self.dtype, lambda: xglm_sinusoids(
                computed[0] + offset, cfg.hidden_size, cfg.pad_token_id)[offset:]
                .astype(self.dtype))
        if cfg.spec.sinusoidal_positions == "ctrl":
            return g.weight("sinusoidal_positions", computed, self.dtype,
                            lambda: ctrl_sinusoids(*computed).astype(self.dtype))
        name = self.names.position_embed
        assert name is not None
        stored = (cfg.max_positions + offset, cfg.hidden_size)
        # the key as config.json names it (GPT-2's and GPTBigCode's n_positions)
        key = "n_positions" if "n_positions" in cfg.spec.defaults else "max_position_embeddings"
        if self.w.shape(name) != stored:
            raise ExportError(
                f"{name} has shape {self.w.shape(name)}, but config.json implies {stored} "
                f"({key} {cfg.max_positions}"
                f"{f' + offset {offset}' if offset else ''}, hidden {cfg.hidden_size})"
            )
        if not offset:
            return self.w.tensor(name)
        return g.weight(name + ".from_position_0", shape, self.dtype,
                        lambda: self.ckpt.get(name, self.dtype)[offset:])

    def _check_vocab_shape(self, name: str, extra_rows: int = 0) -> None:
        """The embedding table and the LM head are [vocab_size, hidden]: the bundle's logits
        are as wide as config.json's vocab_size, so a table of another height would export
        a graph that fails at its first call. `extra_rows`: the embedding's rows beyond the
        vocabulary (Mllama's image tokens), which no text token reads."""
        cfg = self.cfg
        rows, width = cfg.vocab_size + extra_rows, cfg.embed_width or cfg.hidden_size
        if self.w.shape(name) != (rows, width):
            raise ExportError(
                f"{name} has shape {self.w.shape(name)}, but config.json implies "
                f"{(rows, width)} (vocab_size {cfg.vocab_size}, "
                f"{'word_embed_proj_dim' if cfg.embed_width else 'hidden_size'} {width})"
            )

    def _lm_head(self, hidden: str) -> str:
        """[B, hidden] -> [B, vocab]. Stored [vocab, hidden] as in the checkpoint, read by
        Gemm(transB=1) without a transposed copy.

        Tied embeddings are written twice, as the Gather table and as the LM head: ONNX
        Runtime repacks the Gemm's weight into its own buffer at load, and a table shared
        with the Gather would then be held twice in memory (the packed copy and the
        original, all of it read by the packing). Kept apart, the Gather's table stays
        memory-mapped and only the rows of tokens seen are resident: 108 MiB less RSS
        after load on the SmolLM2-135M shape, for 113 MB more on disk (docs/benchmarks.md)."""
        name = head_weight(self.ckpt, self.cfg)
        self._check_vocab_shape(name, self.cfg.head_extra_rows)
        shape = (self.cfg.vocab_size, self.w.shape(name)[1])  # the logits' rows only
        bias = None
        if self.cfg.lm_head_bias:
            bias = self.w.resolve(tuple(h + ".bias" for h in self.names.lm_head))
            self.w.check_bias(bias, self.w.shape(name)[0],
                              f"{name} of shape {self.w.shape(name)}")
        if self.quant is not None and self.quant.head_kind != "float":
            vocab, hidden_size = shape
            def out_in():
                return self._head_rows(name, np.float32)
            logits = self.w.quantized_matmul(hidden, "lm_head", hidden_size, vocab, out_in,
                                             self.quant.head_kind)
            return logits if bias is None else self.g.op("Add", [logits, self.w.tensor(bias)])
        head = self.g.weight("lm_head.weight", shape, self.dtype,
                             lambda: self._head_rows(name, self.dtype))
        inputs = [hidden, head] if bias is None else [hidden, head, self.w.tensor(bias)]
        return self.g.op("Gemm", inputs, transB=1)

    def _head_rows(self, name: str, dtype: np.dtype) -> np.ndarray:
        """The LM head [vocab, hidden] as `dtype`; where the model normalizes its rows
        (Baichuan 2's NormHead: torch's F.normalize, each row over max(its L2 norm, 1e-12),
        at its first forward), normalized here once, in float32. Rows past vocab_size (an
        unembedding padded past the logits: ModelConfig.head_extra_rows) are cut off."""
        if not self.cfg.lm_head_normalized:
            rows = self.ckpt.get(name, dtype)
            return rows if not self.cfg.head_extra_rows else \
                np.ascontiguousarray(rows[:self.cfg.vocab_size])
        rows = self.ckpt.get(name, np.float32)[:self.cfg.vocab_size]
        norms = np.sqrt(np.einsum("vh,vh->v", rows, rows, dtype=np.float32))[:, None]
        return (rows / np.maximum(norms, np.float32(1e-12))).astype(dtype)
