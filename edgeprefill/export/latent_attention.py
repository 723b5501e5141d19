"""Multi-head latent attention (DeepSeek-V2's MLA: MiniCPM3, Youtu-LLM, DeepSeek-V2),
absorbed as llama.cpp and vLLM decode it, so that a token's cache is its latent.

transformers projects each token to a latent c (kv_lora_rank wide, RMS-normed) and a key
part k_pe (qk_rope_head_dim, rotated, shared by every head), caches those, and expands
them per head with kv_b_proj into keys [k_nope | k_pe] and values v. Since
q_nope . (W_UK c) = (W_UK^T q_nope) . c, the bundle folds W_UK into the query and caches
one KV head of width r + L holding [k_pe | c]: multi-query attention whose value is the
key itself, whose output's last L columns are softmax . c, and W_UV turns those into each
head's value output. Rope comes first in the head so that a partial rotary on the first
r dims (either flavour's, or ONNX Runtime's RotaryEmbedding) rotates exactly k_pe and
q_pe; it runs outside the attention op, which gets do_rotary=0.

    q      [N, H, nope | r] --W_UK--> [N, H, r | L]    (q_pe first, then W_UK^T q_nope)
    k      [N, 1, r | L]   = [k_pe | RMSNorm(c)]        (the cache's one KV head)
    v      = k
    out    [N, H, r | L]   --last L, W_UV--> [N, H * v_head_dim] -> o_proj

In the ort flavour the manifest lists every such layer in graph.value_is_key: since v = k,
the runtime binds one buffer as the layer's key and value caches (engines/ort/value_cache.py).

The scale is transformers': qk_head_dim^-0.5, times yarn's mscale^2 where the rope has
mscale_all_dim (ModelConfig.attn_scale). Kimi Linear's MLA rotates nothing (its layers'
rope is None: k_pe is cached as projected); Bailing hybrid's gates each head's value
output by sigmoid(g_proj(x)) before o_proj (FamilySpec.latent_head_gate), Hy4's each value
channel by sigmoid(gate_proj(x)) (FamilySpec.latent_channel_gate), and Hy4's softmax has a
sink logit per head (FamilySpec.sinks, as gpt-oss's). DeepSeek sparse
attention (DeepSeek-V3.2, GLM-5: export/sparse_index.py) caches its index key as more
columns of the head, [k_pe | c | index_k], where the queries are zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx.helper import np_dtype_to_tensor_dtype

from edgeprefill.contract import kv_names
from edgeprefill.errors import ExportError

if TYPE_CHECKING:
    from edgeprefill.export.decoder import DecoderBuilder, Rows
    from edgeprefill.export.flavors import Flavor, StepTensors
    from edgeprefill.export.layer_attention import LayerAttention
    from edgeprefill.export.model_config import ModelConfig
    from edgeprefill.export.sparse_index import Indexer

# DeepseekV2RMSNorm's default, which q_a_layernorm and kv_a_layernorm keep whatever the
# model's rms_norm_eps (they are built without an eps).
LATENT_EPS = 1e-6


@dataclass(frozen=True)
class LatentShape:
    """The config's MLA dimensions; q_lora_rank None: q_proj is one dense projection."""

    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int  # qk_nope_head_dim
    rope_dim: int  # qk_rope_head_dim
    v_dim: int  # v_head_dim
    # DeepSeek Sparse Attention: the index key's columns after [k_pe | c] in the cached head
    # (export/sparse_index.py); 0: none.
    index_dim: int = 0
    # LongCat-Flash's LoRA scaling (mla_scale_q_lora, mla_scale_kv_lora): the query times
    # sqrt(hidden / q_lora_rank), the normed latent (cached so) times sqrt(hidden /
    # kv_lora_rank); 1.0: none
    q_scale: float = 1.0
    latent_scale: float = 1.0
    # The eps of q_a_layernorm and kv_a_layernorm (dots.3's and Hy4-VL's are built at
    # rms_norm_eps)
    norm_eps: float = LATENT_EPS
    # dots.3: the key part k_pe RMS-normed (k_rope_only_layernorm, at norm_eps) before rotary
    rope_norm: bool = False

    @property
    def qk_dim(self) -> int:
        """Each head's query/key width in transformers (nope + rope)."""
        return self.nope_dim + self.rope_dim

    @property
    def index_start(self) -> int:
        """The cached head's first index key column (its width where none)."""
        return self.rope_dim + self.kv_lora_rank

    @property
    def cache_dim(self) -> int:
        """The width of the one cached KV head: [k_pe | c], then any index key."""
        return self.rope_dim + self.kv_lora_rank + self.index_dim


def read_latent(raw: dict[str, Any], norms_at_eps: bool = False) -> LatentShape:
    """The MLA dimensions of config.json (DeepseekV2Config's keys); the latent norms at
    its rms_norm_eps where `norms_at_eps` (FamilySpec.latent_norms_at_eps), else at
    LATENT_EPS."""
    q_rank = raw.get("q_lora_rank")
    shape = LatentShape(
        q_lora_rank=None if q_rank is None else int(q_rank),
        kv_lora_rank=int(raw["kv_lora_rank"]), nope_dim=int(raw["qk_nope_head_dim"]),
        rope_dim=int(raw["qk_rope_head_dim"]), v_dim=int(raw["v_head_dim"]),
        norm_eps=float(raw["rms_norm_eps"]) if norms_at_eps else LATENT_EPS)
    if raw.get("mla_scale_q_lora") or raw.get("mla_scale_kv_lora"):
        shape = replace(shape, **_lora_scales(raw, shape))
    if min(shape.kv_lora_rank, shape.rope_dim, shape.v_dim) < 1 or shape.nope_dim < 0 \
            or shape.rope_dim % 2 or (q_rank is not None and int(q_rank) < 1):
        raise ExportError(f"config.json: MLA dimensions must be positive and "
                          f"qk_rope_head_dim even, got {shape}")
    return shape


def _lora_scales(raw: dict[str, Any], shape: LatentShape) -> dict[str, float]:
    """LongcatFlashMLA's mla_scale_q_lora and mla_scale_kv_lora, where switched on."""
    hidden = int(raw["hidden_size"])
    scales = {}
    if raw.get("mla_scale_q_lora"):
        if shape.q_lora_rank is None:
            raise ExportError("config.json: mla_scale_q_lora needs a q_lora_rank")
        scales["q_scale"] = (hidden / shape.q_lora_rank) ** 0.5
    if raw.get("mla_scale_kv_lora"):
        scales["latent_scale"] = (hidden / shape.kv_lora_rank) ** 0.5
    return scales


def latent_scale(shape: LatentShape, rope_params: dict[str, Any]) -> float:
    """transformers' yarn_apply_mscale: qk_head_dim^-0.5, times mscale(factor,
    mscale_all_dim)^2 where a non-default rope has mscale_all_dim."""
    scale = shape.qk_dim**-0.5
    kind = rope_params.get("rope_type", rope_params.get("type", "default"))
    all_dim = rope_params.get("mscale_all_dim") or 0
    if kind != "default" and all_dim:
        factor = float(rope_params["factor"])
        mscale = 1.0 if factor <= 1 else 0.1 * float(all_dim) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class LatentAttention:
    """Emits the attention of the MLA layers of one shape up to o_proj's input. `builder`
    is the DecoderBuilder (its graph, weights, token layout and config); `cfg` those layers'
    config (ModelConfig.for_layer: dots.3's sliding layers have latent sizes and heads of
    their own), `flavor` its flavour; `indexer` the model's DSA indexer (one for every
    layer: shared layers reuse the last selection), None: none."""

    def __init__(self, builder: DecoderBuilder, cfg: ModelConfig, flavor: Flavor,
                 indexer: Indexer | None) -> None:
        self.b = builder
        assert cfg.latent is not None
        self.shape: LatentShape = cfg.latent
        self.layer_cfg = cfg
        self.heads = cfg.num_heads
        self.flavor = flavor
        self.indexer = indexer

    def attention(self, p: str, h: str, i: int, step: StepTensors, layer: LayerAttention,
                  rows: Rows) -> str:
        """h [B,C,hidden] or packed [1,T,hidden] -> [.., H * v_dim] (rows of the tokens)."""
        b, g, cfg = self.b, self.b.g, self.b.cfg
        n = cfg.names
        q, q_resid, gate = self._absorbed_query(p, h)
        scale = b.layer_query_scale(layer)
        if scale is not None:  # Mistral 4: per position, linear in q, so as after rotary
            q = g.op("Mul", [q, scale])
        kv = b.w.linear(h, [p + n.kv_a + ".weight"],
                        p + n.kv_a + ".bias" if cfg.qkv_bias else None)
        latent, k_pe = g.op("Split", [kv, g.const([self.shape.kv_lora_rank,
                                                   self.shape.rope_dim])], 2, axis=-1)
        latent = self.flavor.rms_norm(g, latent, b.w.tensor(p + n.kv_a_norm + ".weight"),
                                      self.shape.norm_eps)
        if self.shape.latent_scale != 1.0:  # LongCat-Flash, dots.3: cached scaled
            latent = g.op("Mul", [latent, g.const(self.shape.latent_scale, b.dtype)])
        if self.shape.rope_norm:  # dots.3: the shared key part normed before rotary
            k_pe = self.flavor.rms_norm(g, k_pe, b.w.tensor(p + "self_attn.k_rope_only_"
                                                             "layernorm.weight"),
                                        self.shape.norm_eps)
        k = g.op("Concat", [k_pe, latent], axis=-1)  # [.., r + L]
        q, k = b.tokens.spread(q), b.tokens.spread(k)
        names = kv_names(i)
        kept = None
        if self.indexer is not None and self.indexer.indexes(i):
            # DSA: the index key cached after [k_pe | c]
            assert layer.rope is not None
            k_index, kept = self.indexer.layer(p + "self_attn.indexer.", h, q_resid, i, step,
                                               layer.rope, names.past_key, self.shape.index_start)
            k = g.op("Concat", [k, k_index], axis=-1)
        if layer.rope is not None:  # Kimi Linear's MLA rotates nothing (NoPE)
            q, k = self.flavor.rotary(g, q, k, step, layer.rope)
        # Hy4's sinks, one per query head of these layers
        sink = b.layer_sinks(p, self.layer_cfg) if cfg.spec.sinks else None
        if kept is not None:  # the one latent KV head's
            kept = g.op("Unsqueeze", [kept, g.const([1])])
        out = self.flavor.attention(g, q, k, k, (names.past_key, names.past_value),
                                    (names.present_key, names.present_value), step,
                                    replace(layer, rope=None), sink, kept=kept)
        out = rows(b.tokens.gather(out, self.heads * self.shape.cache_dim))
        values = self._values(p, out)
        if cfg.spec.latent_head_gate:  # Bailing: each head's values times its gate
            values = self._head_gated(p, rows(h), values)
        if cfg.spec.latent_channel_gate:  # Hy4: gate_proj of the layer's input
            gate = self._channel_gate(p, h)
        if gate is not None:  # A.X K2, Hy4: each value channel times its gate's sigmoid
            values = g.op("Mul", [values, self._sigmoid32(rows(gate))])
        return values

    def _channel_gate(self, p: str, h: str) -> str:
        """Hy4's gate per value channel before its sigmoid, [.., H * v]: gate_proj(h)."""
        b, s, heads = self.b, self.shape, self.b.cfg.num_heads
        name = p + "self_attn.gate_proj.weight"
        self._check(name, (heads * s.v_dim, b.cfg.hidden_size))
        return b.w.linear(h, [name], None)

    def _sigmoid32(self, x: str) -> str:
        """sigmoid(x) computed in float32, cast back to the graph's dtype."""
        g, dtype = self.b.g, self.b.dtype
        if dtype == np.float32:
            return g.op("Sigmoid", [x])
        return g.op("Cast", [g.op("Sigmoid", [g.op("Cast", [x], to=1)])],
                    to=int(np_dtype_to_tensor_dtype(dtype)))

    def _head_gated(self, p: str, h: str, values: str) -> str:
        """values [.., H * v] times sigmoid(g_proj(h)) per head, the sigmoid in float32 and
        cast back, as BailingHybridAttention (and dots.3) gates its output before o_proj."""
        b, g, s, heads = self.b, self.b.g, self.shape, self.heads
        name = p + b.cfg.names.head_gate[0] + ".weight"
        self._check(name, (heads, b.cfg.hidden_size))
        gate = self._sigmoid32(b.w.linear(h, [name], None))
        # any leading axes: the last layer's rows may be one per sequence ([B, H * v])
        split = g.op("Concat", [g.op("Shape", [values], end=-1), g.const([heads, s.v_dim])],
                     axis=0)
        per_head = g.op("Reshape", [values, split])
        gated = g.op("Mul", [per_head, g.op("Unsqueeze", [gate, g.const([-1])])])
        return g.op("Reshape", [gated, self._leading(values, heads * s.v_dim)])

    def _absorbed_query(self, p: str, h: str) -> tuple[str, str, str | None]:
        """([.., H * cache_dim]: each head's q_pe, then its q_nope through W_UK, then zeros
        in any index key's columns; q_resid, the normed q_a_proj (h where q_proj is one
        dense projection); A.X K2's value gate [.., H * v] before its sigmoid, else None)."""
        b, g, s, heads = self.b, self.b.g, self.shape, self.heads
        n = b.cfg.names
        q_resid, gate = h, None
        if b.cfg.spec.latent_query_gate:
            q, q_resid, gate = self._gated_query(p, h)
        elif s.q_lora_rank is None:
            last = p + n.q + ".weight"
            self._check(last, (heads * s.qk_dim, b.cfg.hidden_size))
            q = b.w.linear(h, [last], None)
        else:
            last = p + n.q_b + ".weight"
            self._check(last, (heads * s.qk_dim, s.q_lora_rank))
            q = b.w.linear(h, [p + n.q_a + ".weight"],
                           p + n.q_a + ".bias" if b.cfg.qkv_bias else None)
            q_resid = self.flavor.rms_norm(g, q, b.w.tensor(p + n.q_a_norm + ".weight"),
                                           s.norm_eps)
            q = b.w.linear(q_resid, [last], None)
        if s.q_scale != 1.0:  # LongCat-Flash, dots.3: q_nope and q_pe alike
            q = g.op("Mul", [q, g.const(s.q_scale, b.dtype)])
        per_head = g.op("Reshape", [q, g.const([-1, heads, s.qk_dim])])  # [N,H,nope+r]
        nope, pe = g.op("Split", [per_head, g.const([s.nope_dim, s.rope_dim])], 2, axis=-1)
        absorbed = self._per_head(nope, self._up_weight(p, "uk"))  # [N,H,L]
        both = g.op("Concat", [pe, absorbed], axis=-1)
        if s.index_dim:  # zero against the index key: the scores stay the MLA's
            both = g.op("Pad", [both, g.const([0, 0, 0, 0, 0, s.index_dim])])
        return g.op("Reshape", [both, self._leading(q, heads * s.cache_dim)]), q_resid, gate

    def _gated_query(self, p: str, h: str) -> tuple[str, str, str]:
        """A.X K2 (FamilySpec.latent_query_gate): q_gate_proj of [q_resid | q_a_proj(h)]
        as the query [.., H * (nope + r)] and the value gate [.., H * v], with q_resid.
        q_gate_proj's rows interleave the two per head, so each part is stored apart,
        float in quantized bundles."""
        b, g, s, heads = self.b, self.b.g, self.shape, self.heads
        n = b.cfg.names
        assert s.q_lora_rank is not None  # the family's refusal
        compressed = b.w.linear(h, [p + n.q_a + ".weight"],
                                p + n.q_a + ".bias" if b.cfg.qkv_bias else None)
        q_resid = self.flavor.rms_norm(g, compressed,
                                        b.w.tensor(p + n.q_a_norm + ".weight"), s.norm_eps)
        x = g.op("Concat", [q_resid, compressed], axis=-1)
        name = p + "self_attn.q_gate_proj.weight"
        self._check(name, (heads * (s.qk_dim + s.v_dim), 2 * s.q_lora_rank))

        def part(start: int, width: int) -> str:
            def produce() -> np.ndarray:
                w = b.ckpt.get(name, np.float32).reshape(heads, s.qk_dim + s.v_dim, -1)
                rows = w[:, start:start + width].reshape(heads * width, -1)
                return np.ascontiguousarray(rows.T).astype(b.dtype)

            weight = g.weight(f"{name}.{start}", (2 * s.q_lora_rank, heads * width), b.dtype,
                              produce)
            return g.op("MatMul", [x, weight])

        return part(0, s.qk_dim), q_resid, part(s.qk_dim, s.v_dim)

    def _values(self, p: str, out: str) -> str:
        """attention's output [.., H * cache_dim] -> each head's value output [.., H * v]
        (its latent columns: any index key's are dropped)."""
        g, s, heads = self.b.g, self.shape, self.heads
        per_head = g.op("Reshape", [out, g.const([-1, heads, s.cache_dim])])
        latent = g.op("Slice", [per_head, g.const([s.rope_dim]), g.const([s.index_start]),
                                g.const([2])])  # softmax . c: [N,H,L]
        values = self._per_head(latent, self._up_weight(p, "uv"))  # [N,H,v]
        return g.op("Reshape", [values, self._leading(out, heads * s.v_dim)])

    def _check(self, name: str, expected: tuple[int, int]) -> None:
        """A checkpoint that disagrees with its config.json fails here, in one line."""
        s = self.shape
        self.b.w.check_shapes(
            [(name, expected)],
            f"{self.heads} heads, qk_nope_head_dim {s.nope_dim}, qk_rope_head_dim "
            f"{s.rope_dim}, v_head_dim {s.v_dim}, kv_lora_rank {s.kv_lora_rank}, q_lora_rank "
            f"{s.q_lora_rank}")

    def _per_head(self, x: str, weight: str) -> str:
        """x [N,H,a] times each head's own [a, b] (weight [H,a,b]) -> [N,H,b]."""
        g = self.b.g
        heads_first = g.op("Transpose", [x], perm=[1, 0, 2])  # [H,N,a]
        return g.op("Transpose", [g.op("MatMul", [heads_first, weight])], perm=[1, 0, 2])

    def _leading(self, x: str, width: int) -> str:
        """The shape of x with its last axis `width` wide."""
        g = self.b.g
        return g.op("Concat", [g.op("Shape", [x], end=-1), g.const([width])], axis=0)

    def _up_weight(self, p: str, which: str) -> str:
        """kv_b_proj [H * (nope + v), L] as W_UK [H, nope, L] ("uk", multiplying q_nope)
        or W_UV^T [H, L, v] ("uv", multiplying the attended latent). Kept float in
        quantized bundles: batched per head, no quantized op takes it."""
        b, s, heads = self.b, self.shape, self.heads
        name = p + b.cfg.names.kv_b + ".weight"
        self._check(name, (heads * (s.nope_dim + s.v_dim), s.kv_lora_rank))

        def produce() -> np.ndarray:
            w = b.ckpt.get(name, np.float32).reshape(heads, s.nope_dim + s.v_dim,
                                                     s.kv_lora_rank)
            part = w[:, : s.nope_dim] if which == "uk" else \
                w[:, s.nope_dim :].transpose(0, 2, 1)
            return np.ascontiguousarray(part).astype(b.dtype)

        shape = (heads, s.nope_dim, s.kv_lora_rank) if which == "uk" else \
            (heads, s.kv_lora_rank, s.v_dim)
        return b.g.weight(f"{p}self_attn.w_{which}", shape, b.dtype, produce)
