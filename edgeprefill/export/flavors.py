"""The two graph flavours: what differs between the `ort` and the `standard` chunk graph.

Both take the same inputs and give the same outputs (see docs/design.md); they differ in
how a step's attention reads and writes the fixed-capacity KV cache:

- `ort`: `com.microsoft.GroupQueryAttention` with rotary inside and the past/present
  buffers shared, so the cache is updated in place and attention reads only each row's
  valid prefix; it takes the packed q/k/v projection whole. `SimplifiedLayerNormalization`
  for RMSNorm, fused with the residual add (`SkipSimplifiedLayerNormalization`).
- `standard`: plain ONNX ops for TensorRT's ONNX parser. `TensorScatter` (opset 24) writes
  the chunk's K/V into the cache in place; attention is MatMul/Softmax over the whole
  capacity with a causal mask built from positions. RMSNorm is spelled out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export import alibi, differential, dynamic_mask
from edgeprefill.export.dynamic_mask import DynamicMask
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.layer_attention import LayerAttention
from edgeprefill.export.model_config import ModelConfig


@dataclass(frozen=True)
class StepTensors:
    """Graph values shared by every layer of one step."""

    past_lens: str  # [B] int32
    chunk: str  # [1] int64, C
    extra: dict[str, str]  # flavour-specific values (rotary tables, masks, seqlens)


class Flavor(ABC):
    name: str
    opsets: dict[str, int]
    packed_qkv = False  # attention() takes q as the packed [B,C,(H+2KV)*D] projection
    # The graph computes only the valid tokens outside attention (export/tokens.py): a call
    # whose rows have different valid lengths (a prefill chunk beside decode rows) costs
    # what its valid tokens cost. TensorRT engines keep static [B, C] activations.
    packs_tokens = False
    # A mixture of experts may be ONNX Runtime's com.microsoft MoE/QMoE op (export/moe_op.py)
    # rather than the unrolled dispatch of stock ops (export/moe.py).
    moe_op = False
    # BitNet's ternary projections may be MatMulInteger (export/bitlinear.py): ONNX
    # Runtime runs it; TensorRT's parser has none.
    integer_matmul = False

    def __init__(self, cfg: ModelConfig, dtype: np.dtype, max_context: int) -> None:
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.max_context = max_context

    @abstractmethod
    def step_tensors(
        self, g: GraphBuilder, past_lens: str, chunk: str, past_key0: str
    ) -> StepTensors:
        """Values every layer needs, computed once per step (`past_key0` gives the
        cache capacity)."""

    @abstractmethod
    def rms_norm(self, g: GraphBuilder, x: str, weight: str, eps: float | None = None) -> str:
        """RMSNorm over the last axis of x; `eps` where the norm has its own (Muse
        Glimmer's post-sublayer norms, the latent attention's), else the model's norm_eps."""

    def add_rms_norm(
        self, g: GraphBuilder, x: str, delta: str | None, weight: str
    ) -> tuple[str, str]:
        """The residual step: (x + delta, RMSNorm(x + delta)); delta None adds nothing."""
        if delta is not None:
            x = g.op("Add", [x, delta])
        return x, self.rms_norm(g, x, weight)

    def layer_norm(self, g: GraphBuilder, x: str, weight: str, bias: str | None,
                   eps: float | None = None) -> str:
        """LayerNorm over the last axis (statistics in float32); bias None: none; `eps`
        where the norm has its own (Chameleon's q/k norms, DSA's index key norm), else the
        model's norm_eps."""
        x32 = x if self.dtype == np.float32 else g.op("Cast", [x], to=1)
        params = [weight] if bias is None else [weight, bias]
        if self.dtype != np.float32:
            params = [g.op("Cast", [p], to=1) for p in params]
        y = g.op("LayerNormalization", [x32, *params], axis=-1,
                 epsilon=self.cfg.norm_eps if eps is None else eps)
        return y if self.dtype == np.float32 else g.op("Cast", [y], to=10)

    @abstractmethod
    def attention(
        self, g: GraphBuilder, q: str, k: str, v: str, past: tuple[str, str],
        present: tuple[str, str], step: StepTensors, layer: LayerAttention,
        sink: str | None = None, dynamic: DynamicMask | None = None,
        kept: str | None = None, bias: str | None = None,
    ) -> str:
        """Causal attention of q [B,C,H*D] over the cache after writing k, v [B,C,KV*D]
        at each row's past length, within the layer's sliding window if it has one. `past`
        are the cache inputs [B,KV,cap,D]; the updated caches are produced under the
        `present` names. `sink` [H] (gpt-oss): each head's sink logit, which joins the
        softmax's denominator (its weight attends to nothing). `dynamic` (Doge): each
        key's bias from its values added to the scores, the top keys kept
        (export/dynamic_mask.py). `kept` [B,KV,C,K] bool (index_keys' K): the keys each
        query keeps, per KV head (DeepSeek Sparse Attention's one latent head; MiniMax-M3's
        blocks, export/block_index.py), the others masked. `bias` [B,H,C,K] (K: the keys
        key_positions gives): added to the scaled scores (Inkling's relative bias). Returns
        [B,C,H*D]; the layer's rotary (if any) applied."""

    @abstractmethod
    def key_positions(self, g: GraphBuilder, step: StepTensors, past_key: str) -> str:
        """[K] int64: the positions of the keys attention() reads, 0..K-1 (the cache's
        capacity, standard; the op's total, ort)."""

    @abstractmethod
    def index_keys(self, g: GraphBuilder, k_index: str, past_key: str, step: StepTensors,
                   start: int, width: int | None = None, head: int = 0) -> tuple[str, str]:
        """DeepSeek Sparse Attention (export/sparse_index.py), MiniMax-M3's block index
        (export/block_index.py): every index key a query of the step may score, [B,K,Di]
        (the cache's columns start to start + width of KV head `head`, width None: to the
        head's end; the chunk's own k_index [B,C,Di] at its positions), and which each
        query sees, [B,C,K] bool. K is the width attention() reads: the capacity
        (standard) or the op's total (ort)."""

    @abstractmethod
    def rope_at_tokens(self, g: GraphBuilder, step: StepTensors, rope: str
                       ) -> tuple[str, str]:
        """cos and sin [B,C,rotary_dim/2] of the rope named `rope` at each token's position."""

    @abstractmethod
    def differential_attention(
        self, g: GraphBuilder, q: str, k: str, v: str, past: tuple[str, str],
        present: tuple[str, str], step: StepTensors, layer: LayerAttention,
    ) -> tuple[str, str]:
        """DiffLlama (export/differential.py): attention() of q over the cache after
        writing k, v, twice: with each KV head's own values and with those of the head half
        the heads away (differential.swapped). Each [B,C,H*D]; the cache written once."""

    @abstractmethod
    def rotary(self, g: GraphBuilder, q: str, k: str, step: StepTensors,
               rope: str) -> tuple[str, str]:
        """q [B,C,H*D] and k [B,C,KV*D] rotated at each row's positions by the rope named
        `rope`, for families that change them between rotary and attention (HunYuan's
        q/k norms); attention then gets a layer without rope."""

    def rope_table_names(self) -> dict[str, str]:
        """Rope name used by some layer -> the stem of its table (equal ropes share one)."""
        out: dict[str, str] = {}
        for layer in self.cfg.layers:
            if layer.rope is None or layer.rope in out:
                continue
            rope = self.cfg.ropes[layer.rope]
            same = [n for n in out if self.cfg.ropes[n] == rope]
            out[layer.rope] = out[same[0]] if same else f"rotary.{layer.rope}"
        return out

    def rotary_tables(self, g: GraphBuilder, stem: str, rope_name: str) -> tuple[str, str]:
        """cos and sin [max_context + 1, rotary_dim/2], as transformers computes them
        (float32 math, times the rope's cos/sin scale for yarn and longrope).

        One position past max_context is kept so that a dummy decode row parked at a full
        slot's end still has a valid rotary entry; its output is never used.
        """
        rope = self.cfg.ropes[rope_name]
        positions = np.arange(self.max_context + 1, dtype=np.float32)
        freqs = np.outer(positions, rope.inv_freq()).astype(np.float32)
        scale = np.float32(rope.cos_sin_scale())

        def table(fn):
            return lambda: (fn(freqs) * scale).astype(self.dtype)

        cos = g.weight(stem + ".cos", freqs.shape, self.dtype, table(np.cos))
        sin = g.weight(stem + ".sin", freqs.shape, self.dtype, table(np.sin))
        return cos, sin


class OrtFlavor(Flavor):
    name = "ort"
    opsets = {"": 21, "com.microsoft": 1}
    packed_qkv = True  # GroupQueryAttention splits the packed projection itself
    packs_tokens = True
    moe_op = True
    integer_matmul = True

    def __init__(self, cfg: ModelConfig, dtype: np.dtype, max_context: int) -> None:
        super().__init__(cfg, dtype, max_context)
        if cfg.head_dim % 16:
            # ORT's GroupQueryAttention kernels work on 16-wide head blocks.
            raise ExportError(
                f"the ort flavour needs head_dim to be a multiple of 16 (got "
                f"{cfg.head_dim}); export with --flavor standard"
            )
        if any(layer.rope for layer in cfg.layers) and cfg.rotary_dim % 16:
            # Its rotary wants cos/sin tables whose width (rotary_dim / 2) is a multiple of 8.
            raise ExportError(
                f"the ort flavour needs the rotary dimension to be a multiple of 16 (got "
                f"{cfg.rotary_dim} of head_dim {cfg.head_dim}); export with --flavor standard"
            )

    def step_tensors(self, g, past_lens, chunk, past_key0):
        chunk32 = g.op("Cast", [chunk], to=6)
        # GroupQueryAttention wants seqlens_k = total length - 1 per row, where total
        # counts the chunk's padded tokens too: they are written past the valid ones and
        # masked causally, then overwritten by the next step.
        seqlens_k = g.op("Sub", [g.op("Add", [past_lens, chunk32]), g.const([1], np.int32)])
        max_past = g.op("ReduceMax", [past_lens], keepdims=0)
        total = g.op("Add", [max_past, g.op("Squeeze", [chunk32, g.const([0])])])
        extra = {"seqlens_k": seqlens_k, "total": total}
        if self.cfg.alibi is not None:
            extra["alibi"] = self.alibi_bias(g, self.cfg.alibi, past_lens, chunk, total)
        # rotary outside attention (rotary()): HunYuan's norms of the rotated q/k, MLA's
        # rope part of a head
        if self.cfg.qk_norm == "head_rotated" or self.cfg.latent is not None \
                or self.cfg.block_index is not None:
            extra["positions"] = positions(g, g.op("Cast", [past_lens], to=7), chunk)
        tables: dict[str, tuple[str, str]] = {}
        for rope, stem in self.rope_table_names().items():
            if stem not in tables:
                tables[stem] = self.rotary_tables(g, stem, rope)
            extra[rope + ".cos"], extra[rope + ".sin"] = tables[stem]
        return StepTensors(past_lens, chunk, extra)

    def alibi_bias(self, g: GraphBuilder, slopes: tuple[float, ...], past_lens: str,
                   chunk: str, total: str) -> str:
        """GroupQueryAttention's attention_bias [B,H,C,total] for ALiBi: the keys of a row
        are its cache positions 0..total-1 (total: the longest row's past + C, the width the
        op reads; its causal mask hides each row's keys past the query)."""
        key_pos = g.op("Range", [g.const(0), g.op("Cast", [total], to=7), g.const(1)])
        query_pos = positions(g, g.op("Cast", [past_lens], to=7), chunk)
        return alibi.bias(g, slopes, key_pos, query_pos, (self.cfg.num_heads,), self.dtype,
                          self.cfg.alibi_bfloat16_scale)

    def dynamic_bias(self, g: GraphBuilder, v: str, past_value: str, step: StepTensors,
                     layer: LayerAttention, dynamic: DynamicMask) -> str:
        """GroupQueryAttention's attention_bias [B,H,C,total] for Doge: each key's bias
        (dynamic_mask.py) over a row's cache positions 0..total-1, the chunk's own keys
        from its values `v` [B,C,KV*D] (the op writes them into the cache itself), the
        earlier ones from the value cache; masked as the op's causal mask (and window)
        masks them, then each query's top keys kept."""
        cfg, e = self.cfg, step.extra
        total = g.op("Unsqueeze", [g.op("Cast", [e["total"]], to=7), g.const([0])])  # [1]
        cached = g.op("Slice", [past_value, g.const([0]), total, g.const([2])])
        earlier = dynamic_mask.cache_bias(g, cached, dynamic)  # [B,KV,total]
        own = dynamic_mask.key_bias(g, v, dynamic)  # [B,KV,C]
        past64 = g.op("Cast", [step.past_lens], to=7)
        key_pos = g.op("Range", [g.const(0), g.op("Squeeze", [total, g.const([0])]),
                                 g.const(1)])  # [total]
        at = g.op("Sub", [key_pos, g.op("Unsqueeze", [past64, g.const([1])])])  # [B,total]
        last = g.op("Sub", [step.chunk, g.const([1])])
        index = g.op("Clip", [at, g.const(0), g.op("Squeeze", [last, g.const([0])])])
        index = g.op("Expand", [g.op("Unsqueeze", [index, g.const([1])]),
                                g.op("Shape", [earlier])])  # [B,KV,total]
        chunk_part = g.op("GatherElements", [own, index], axis=2)
        in_chunk = g.op("Unsqueeze", [g.op("GreaterOrEqual", [at, g.const(0)]),
                                      g.const([1])])
        bias = g.op("Unsqueeze", [g.op("Where", [in_chunk, chunk_part, earlier]),
                                  g.const([2])])  # [B,KV,1,total]
        query_pos = positions(g, past64, step.chunk)
        visible = mask_over(g, key_pos, query_pos, layer.window, self.dtype)
        visible = g.op("Squeeze", [visible, g.const([1])])  # [B,1,C,total]
        kept = dynamic_mask.masked(g, bias, visible, dynamic.keep, self.dtype)  # [B,KV,C,T]
        rep = cfg.num_heads // cfg.num_kv_heads
        grouped = g.op("Unsqueeze", [kept, g.const([2])])  # [B,KV,1,C,T]
        shape = g.op("Shape", [grouped])
        wide = g.op("Concat", [g.op("Slice", [shape, g.const([0]), g.const([2])]),
                               g.const([rep]),
                               g.op("Slice", [shape, g.const([3]), g.const([5])])], axis=0)
        heads = g.op("Expand", [grouped, wide])
        flat = g.op("Concat", [g.op("Slice", [shape, g.const([0]), g.const([1])]),
                               g.const([cfg.num_heads]),
                               g.op("Slice", [shape, g.const([3]), g.const([5])])], axis=0)
        return g.op("Reshape", [heads, flat])

    def index_keys(self, g, k_index, past_key, step, start, width=None, head=0):
        # The op reads `total` keys and writes the chunk's itself: the earlier ones come from
        # the cache, the chunk's from k_index, as dynamic_bias merges Doge's.
        e = step.extra
        end = self.cfg.head_dim if width is None else start + width
        total = g.op("Unsqueeze", [g.op("Cast", [e["total"]], to=7), g.const([0])])  # [1]
        cached = g.op("Slice", [past_key, g.const([head, 0, start]),
                                g.op("Concat", [g.const([head + 1]), total, g.const([end])],
                                     axis=0),
                                g.const([1, 2, 3])])
        cached = g.op("Squeeze", [cached, g.const([1])])  # [B,total,Di]
        past64 = g.op("Cast", [step.past_lens], to=7)
        key_pos = g.op("Range", [g.const(0), g.op("Squeeze", [total, g.const([0])]),
                                 g.const(1)])
        at = g.op("Sub", [key_pos, g.op("Unsqueeze", [past64, g.const([1])])])  # [B,total]
        last = g.op("Squeeze", [g.op("Sub", [step.chunk, g.const([1])]), g.const([0])])
        index = g.op("Expand", [g.op("Unsqueeze", [g.op("Clip", [at, g.const(0), last]),
                                                   g.const([2])]), g.op("Shape", [cached])])
        own = g.op("GatherElements", [k_index, index], axis=1)
        in_chunk = g.op("Unsqueeze", [g.op("GreaterOrEqual", [at, g.const(0)]), g.const([2])])
        keys = g.op("Where", [in_chunk, own, cached])
        mask = mask_over(g, key_pos, positions(g, past64, step.chunk), None, self.dtype)
        return keys, visible_of(g, mask, self.dtype)

    def rope_at_tokens(self, g, step, rope):
        e = step.extra
        return tuple(g.op("Gather", [e[rope + part], e["positions"]])  # type: ignore[return-value]
                     for part in (".cos", ".sin"))

    def rms_norm(self, g: GraphBuilder, x: str, weight: str, eps: float | None = None) -> str:
        return g.op(
            "SimplifiedLayerNormalization", [x, weight],
            axis=-1, epsilon=self.cfg.norm_eps if eps is None else eps, stash_type=1,
        )

    def add_rms_norm(self, g, x, delta, weight):
        if delta is None:
            return x, self.rms_norm(g, x, weight)
        # One pass for the residual add and the norm; output 3 is the sum.
        normed, _, _, total = g.op(
            "SkipSimplifiedLayerNormalization", [x, delta, weight],
            [g._name("skip_norm"), "", "", g._name("residual")],
            domain="com.microsoft", epsilon=self.cfg.norm_eps,
        )
        return total, normed

    def rotary(self, g, q, k, step, rope):
        e, d, r = step.extra, self.cfg.head_dim, self.cfg.rotary_dim
        partial = {"rotary_embedding_dim": r} if r < d else {}
        return tuple(g.op(  # type: ignore[return-value]
            "RotaryEmbedding", [x, e["positions"], e[rope + ".cos"], e[rope + ".sin"]],
            domain="com.microsoft", num_heads=heads,
            interleaved=int(self.cfg.spec.rope_interleaved), **partial,
        ) for x, heads in ((q, self.cfg.num_heads), (k, self.cfg.num_kv_heads)))

    def key_positions(self, g, step, past_key):
        return g.op("Range", [g.const(0), g.op("Cast", [step.extra["total"]], to=7),
                              g.const(1)])

    def attention(self, g, q, k, v, past, present, step, layer, sink=None, dynamic=None,
                  kept=None, bias=None):
        cfg = self.cfg
        e = step.extra
        rotary = layer.rope is not None
        cos_sin = [e[layer.rope + ".cos"], e[layer.rope + ".sin"]] if rotary else []
        window = {}
        if layer.window is not None:
            # ONNX Runtime's CPU kernel (1.32) shows a query `local_window_size` keys, its own
            # included: transformers' window. Measured against transformers with chunks that
            # straddle the window (tests/test_exactness.py); window - 1 is off by one.
            window["local_window_size"] = layer.window
        if cfg.attn_softcap is not None:
            window["softcap"] = float(cfg.attn_softcap)
        inputs = [q, k or "", v or "", past[0], past[1], e["seqlens_k"], e["total"], *cos_sin]
        if cfg.alibi is not None:
            # input 10, attention_bias: the CPU kernel adds it to the scaled scores before
            # its causal mask, also with the past/present buffer shared (measured against
            # transformers' BLOOM and MPT, tests/test_alibi.py). The native kernels lack it.
            inputs = inputs + [""] * (10 - len(inputs)) + [e["alibi"]]
        elif dynamic is not None:
            # Doge's bias goes in the same input (the native kernels lack it too)
            bias = self.dynamic_bias(g, v, past[1], step, layer, dynamic)
            inputs = inputs + [""] * (10 - len(inputs)) + [bias]
        elif kept is not None:
            # DeepSeek Sparse Attention's selection (MiniMax-M3's), the same input: 0 where
            # kept, [B,KV,C,T], each KV head's for its query heads
            blocked = g.const(float(np.finfo(self.dtype).min), self.dtype)
            bias = self._per_query_head(g, g.op("Where", [kept, g.const(0.0, self.dtype),
                                                          blocked]))
            inputs = inputs + [""] * (10 - len(inputs)) + [bias]
        elif bias is not None:
            # Inkling's relative bias, [B,H,C,total], the same input (added to the scaled
            # scores before the causal mask and window)
            inputs = inputs + [""] * (10 - len(inputs)) + [bias]
        if sink is not None:
            # input 11, head_sink: the CPU kernel adds exp(sink - max) to each head's
            # softmax denominator, as transformers' eager attention (measured against it,
            # tests/test_gpt_oss.py)
            inputs = inputs + [""] * (11 - len(inputs)) + [sink]
        out, _, _ = g.op(
            "GroupQueryAttention", inputs,
            [g._name("gqa_out"), present[0], present[1]],
            domain="com.microsoft",
            num_heads=cfg.num_heads,
            kv_num_heads=cfg.num_kv_heads,
            scale=float(cfg.attn_scale * layer.scale),
            do_rotary=int(rotary),
            rotary_interleaved=int(cfg.spec.rope_interleaved),
            **window,
        )
        return out

    def _per_query_head(self, g: GraphBuilder, bias: str) -> str:
        """A bias [B,KV,C,T] per KV head as GroupQueryAttention's [B,H,C,T] (one KV head:
        [B,1,C,T], broadcast over the heads)."""
        kv, heads = self.cfg.num_kv_heads, self.cfg.num_heads
        if kv == 1:
            return bias
        grouped = g.op("Expand", [g.op("Unsqueeze", [bias, g.const([2])]),
                                  g.const([1, 1, heads // kv, 1, 1])])  # [B,KV,rep,C,T]
        shape = g.op("Shape", [bias])
        wide = g.op("Concat", [g.op("Slice", [shape, g.const([0]), g.const([1])]),
                               g.const([heads]),
                               g.op("Slice", [shape, g.const([2]), g.const([4])])], axis=0)
        return g.op("Reshape", [grouped, wide])

    def differential_attention(self, g, q, k, v, past, present, step, layer):
        own = self.attention(g, q, k, v, past, present, step, layer)
        # The second call reads copies of the cache it wrote, up to the longest row (what
        # the op reads), the values' halves swapped; writing the chunk's k and swapped v
        # again into those copies changes nothing, and its present outputs go unread.
        total = g.op("Unsqueeze", [g.op("Cast", [step.extra["total"]], to=7), g.const([0])])
        keys, values = (g.op("Slice", [t, g.const([0]), total, g.const([2])]) for t in present)
        copies = (keys, differential.swapped(g, values, 1))
        unread = (g._name("diff_key"), g._name("diff_value"))
        other = self.attention(g, q, k, differential.swapped(g, v, -1), copies, unread, step,
                               layer)
        return own, other


class StandardFlavor(Flavor):
    name = "standard"
    opsets = {"": 24}

    def step_tensors(self, g, past_lens, chunk, past_key0):
        past64 = g.op("Cast", [past_lens], to=7)
        at = positions(g, past64, chunk)  # [B,C]
        extra = {"write_at": past64}
        unsq1 = g.const([1])
        gathered: dict[str, tuple[str, str]] = {}
        for rope, stem in self.rope_table_names().items():
            if stem not in gathered:
                cos_table, sin_table = self.rotary_tables(g, stem, rope)
                gathered[stem] = tuple(  # [B,1,C,rotary/2]
                    g.op("Unsqueeze", [g.op("Gather", [t, at]), unsq1])
                    for t in (cos_table, sin_table)
                )
            extra[rope + ".cos"], extra[rope + ".sin"] = gathered[stem]
        for window in {layer.window for layer in self.cfg.layers}:
            extra[mask_key(window)] = self.causal_mask(g, past_key0, at, window)
        return StepTensors(past_lens, chunk, extra)

    def causal_mask(
        self, g: GraphBuilder, past_key: str, positions: str, window: int | None
    ) -> str:
        """Additive mask [B,1,1,C,cap]: key j is visible to the query at position p iff
        j <= p, and with a sliding window also p - j < window (transformers' window counts
        the query itself). Under ALiBi the bias is added in: [B,KV,rep,C,cap].

        Padded positions of a short last chunk lie after every valid query, so they are
        never visible to a valid token; later chunks overwrite them.
        """
        capacity = g.op("Gather", [g.op("Shape", [past_key]), g.const(2)])
        key_pos = g.op("Range", [g.const(0), capacity, g.const(1)])  # [cap]
        mask = self.mask_over(g, key_pos, positions, window)
        if self.cfg.alibi is None:
            return mask
        # ALiBi's bias joins the mask, once per step for every layer: [B,KV,rep,C,cap]
        cfg = self.cfg
        heads = (cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads)
        return g.op("Add", [mask, alibi.bias(g, cfg.alibi, key_pos, positions, heads,
                                             self.dtype, cfg.alibi_bfloat16_scale)])

    def mask_over(self, g: GraphBuilder, key_pos: str, positions: str,
                  window: int | None) -> str:
        """causal_mask over the keys at `key_pos` ([K] int64) alone: [B,1,1,C,K]."""
        return mask_over(g, key_pos, positions, window, self.dtype)

    def index_keys(self, g, k_index, past_key, step, start, width=None, head=0):
        # attention() reads the whole capacity: the cache's index columns, the chunk's
        # written at its positions as attention() writes the cache
        end = self.cfg.head_dim if width is None else start + width
        cached = g.op("Slice", [past_key, g.const([head, start]), g.const([head + 1, end]),
                                g.const([1, 3])])  # [B,1,cap,Di]
        own = g.op("Unsqueeze", [k_index, g.const([1])])
        keys = g.op("TensorScatter", [cached, own, step.extra["write_at"]], axis=-2)
        keys = g.op("Squeeze", [keys, g.const([1])])
        return keys, visible_of(g, step.extra[mask_key(None)], self.dtype)

    def rope_at_tokens(self, g, step, rope):
        return tuple(g.op("Squeeze", [step.extra[rope + part], g.const([1])])  # type: ignore[return-value]
                     for part in (".cos", ".sin"))

    def rms_norm(self, g: GraphBuilder, x: str, weight: str, eps: float | None = None) -> str:
        # Computed in float32 whatever the graph dtype, as transformers does.
        x32 = x if self.dtype == np.float32 else g.op("Cast", [x], to=1)
        mean_sq = g.op("ReduceMean", [g.op("Mul", [x32, x32]), g.const([-1])], keepdims=1)
        epsilon = g.const(self.cfg.norm_eps if eps is None else eps, np.float32)
        normed = g.op("Div", [x32, g.op("Sqrt", [g.op("Add", [mean_sq, epsilon])])])
        if self.dtype != np.float32:
            normed = g.op("Cast", [normed], to=10)
        return g.op("Mul", [normed, weight])

    def rotary(self, g, q, k, step, rope):
        # The gathered tables are [B,1,C,r/2] for heads-first q/k: [B,C,1,r/2] here.
        cos, sin = (g.op("Transpose", [step.extra[rope + part]], perm=[0, 2, 1, 3])
                    for part in (".cos", ".sin"))
        d = self.cfg.head_dim

        def rotated(x: str, heads: int) -> str:
            per_head = g.op("Reshape", [x, g.const([0, 0, heads, d])])  # [B,C,heads,D]
            return g.op("Reshape", [self.rotate(g, per_head, cos, sin), g.const([0, 0, heads * d])])

        return rotated(q, self.cfg.num_heads), rotated(k, self.cfg.num_kv_heads)

    def rotate(self, g: GraphBuilder, x: str, cos: str, sin: str) -> str:
        """Rotary on the first rotary_dim dims of x [..., D] (halves, or interleaved pairs),
        by cos and sin [..., rotary_dim/2] that broadcast against it."""
        d, r = self.cfg.head_dim, self.cfg.rotary_dim
        rest = None
        if r < d:  # partial rotary: the remaining dims pass through
            x, rest = g.op("Split", [x, g.const([r, d - r])], 2, axis=-1)
        if self.cfg.spec.rope_interleaved:  # pairs (2i, 2i+1): [.., r/2, 2] and back
            pairs = g.op("Reshape", [x, g.const([0, 0, 0, r // 2, 2])])
            x1, x2 = g.op("Split", [pairs], 2, axis=-1, num_outputs=2)  # [B,h,C,r/2,1]
            cos, sin = (g.op("Unsqueeze", [t, g.const([-1])]) for t in (cos, sin))
        else:
            x1, x2 = g.op("Split", [x], 2, axis=-1, num_outputs=2)
        first = g.op("Sub", [g.op("Mul", [x1, cos]), g.op("Mul", [x2, sin])])
        second = g.op("Add", [g.op("Mul", [x2, cos]), g.op("Mul", [x1, sin])])
        rotated = g.op("Concat", [first, second], axis=-1)
        if self.cfg.spec.rope_interleaved:
            rotated = g.op("Reshape", [rotated, g.const([0, 0, 0, r])])
        return rotated if rest is None else g.op("Concat", [rotated, rest], axis=-1)

    def heads_first(self, g: GraphBuilder, x: str, heads: int) -> str:
        """[B,C,heads*D] -> [B,heads,C,D]."""
        split = g.op("Reshape", [x, g.const([0, 0, heads, self.cfg.head_dim])])
        return g.op("Transpose", [split], perm=[0, 2, 1, 3])

    def key_positions(self, g, step, past_key):
        capacity = g.op("Gather", [g.op("Shape", [past_key]), g.const(2)])
        return g.op("Range", [g.const(0), capacity, g.const(1)])

    def attention(self, g, q, k, v, past, present, step, layer, sink=None, dynamic=None,
                  kept=None, bias=None):
        q4, keys, values, mask = self.cached(g, q, k, v, past, present, step, layer, dynamic,
                                             kept)
        if bias is not None:  # Inkling: [B,H,C,cap] as the scores' [B,KV,rep,C,cap]
            cfg = self.cfg
            shape = g.op("Shape", [bias])
            grouped = g.op("Concat", [g.op("Slice", [shape, g.const([0]), g.const([1])]),
                                      g.const([cfg.num_kv_heads,
                                               cfg.num_heads // cfg.num_kv_heads]),
                                      g.op("Slice", [shape, g.const([2]), g.const([4])])],
                           axis=0)
            mask = g.op("Add", [mask, g.op("Reshape", [bias, grouped])])
        return self.attend(g, q4, keys, values, mask, layer, sink)

    def differential_attention(self, g, q, k, v, past, present, step, layer):
        # one softmax over the keys, times [own values | swapped values] (2D wide)
        q4, keys, values, mask = self.cached(g, q, k, v, past, present, step, layer)
        both = g.op("Concat", [values, differential.swapped(g, values, 1)], axis=-1)
        d, heads = self.cfg.head_dim, self.cfg.num_heads
        out = g.op("Reshape", [self.attend(g, q4, keys, both, mask, layer, width=2 * d),
                               g.const([0, 0, heads, 2 * d])])
        own, other = g.op("Split", [out], 2, axis=-1, num_outputs=2)
        return tuple(g.op("Reshape", [t, g.const([0, 0, heads * d])])  # type: ignore[return-value]
                     for t in (own, other))

    def cached(self, g: GraphBuilder, q: str, k: str, v: str, past: tuple[str, str],
               present: tuple[str, str], step: StepTensors, layer: LayerAttention,
               dynamic: DynamicMask | None = None, kept: str | None = None
               ) -> tuple[str, str, str, str]:
        """The rotated q [B,H,C,D], the caches [B,KV,cap,D] with k and v written at each
        row's past length (under the `present` names), and the layer's additive mask (with
        DeepSeek Sparse Attention's `kept` keys only, where given)."""
        cfg = self.cfg
        q4 = self.heads_first(g, q, cfg.num_heads)
        k4 = self.heads_first(g, k, cfg.num_kv_heads)
        if layer.rope is not None:
            cos, sin = step.extra[layer.rope + ".cos"], step.extra[layer.rope + ".sin"]
            q4, k4 = self.rotate(g, q4, cos, sin), self.rotate(g, k4, cos, sin)
        v4 = self.heads_first(g, v, cfg.num_kv_heads)
        write_at = step.extra["write_at"]
        keys = g.op("TensorScatter", [past[0], k4, write_at], [present[0]], axis=-2)
        values = g.op("TensorScatter", [past[1], v4, write_at], [present[1]], axis=-2)
        mask = step.extra[mask_key(layer.window)]
        if dynamic is not None:  # Doge: each key's bias from the cache's values, [B,KV,cap]
            bias = dynamic_mask.cache_bias(g, values, dynamic)
            bias = g.op("Unsqueeze", [bias, g.const([2, 3])])  # [B,KV,1,1,cap]
            mask = dynamic_mask.masked(g, bias, mask, dynamic.keep, self.dtype)
        if kept is not None:  # DeepSeek Sparse Attention: the keys each query keeps, per KV head
            blocked = g.const(float(np.finfo(self.dtype).min), self.dtype)
            mask = g.op("Where", [g.op("Unsqueeze", [kept, g.const([2])]), mask, blocked])
        return q4, keys, values, mask

    def attend(self, g: GraphBuilder, q4: str, keys: str, values: str, mask: str,
               layer: LayerAttention, sink: str | None = None, width: int | None = None) -> str:
        """q4 [B,H,C,D] (rotated) over the whole cache keys [B,KV,cap,D] and values
        [B,KV,cap,width] (width None: D) under the additive `mask` [B,1,1,C,cap], with each
        head's `sink` logit [H] in the softmax where given; returns [B,C,H*width]."""
        cfg = self.cfg
        width = width or cfg.head_dim
        rep = cfg.num_heads // cfg.num_kv_heads
        # Group the query heads by the KV head they share: [B,KV,rep,C,D] against
        # [B,KV,1,cap,D] broadcasts without materializing repeated keys.
        q5 = g.op("Reshape", [q4, g.const([0, cfg.num_kv_heads, rep, -1, cfg.head_dim])])
        keys_t = g.op("Unsqueeze", [g.op("Transpose", [keys], perm=[0, 1, 3, 2]), g.const([2])])
        scale = g.const(cfg.attn_scale * layer.scale, self.dtype)
        scores = g.op("Mul", [g.op("MatMul", [q5, keys_t]), scale])
        if cfg.attn_softcap is not None:  # Gemma 2: c * tanh(scores / c), before the mask
            cap = g.const(cfg.attn_softcap, self.dtype)
            scores = g.op("Mul", [g.op("Tanh", [g.op("Div", [scores, cap])]), cap])
        scores = g.op("Add", [scores, mask])
        probs = (g.op("Softmax", [scores], axis=-1) if sink is None
                 else self._softmax_with_sink(g, scores, sink))
        out = g.op("MatMul", [probs, g.op("Unsqueeze", [values, g.const([2])])])
        out = g.op("Reshape", [out, g.const([0, cfg.num_heads, -1, width])])
        out = g.op("Transpose", [out], perm=[0, 2, 1, 3])
        return g.op("Reshape", [out, g.const([0, 0, cfg.num_heads * width])])

    def _softmax_with_sink(self, g: GraphBuilder, scores: str, sink: str) -> str:
        """Softmax of scores [B,KV,rep,C,cap] with each head's sink logit as one more
        column, that column dropped after (transformers' eager gpt-oss attention)."""
        cfg = self.cfg
        rep = cfg.num_heads // cfg.num_kv_heads
        per_head = g.op("Reshape", [sink, g.const([1, cfg.num_kv_heads, rep, 1, 1])])
        shape = g.op("Concat", [g.op("Shape", [scores], end=-1), g.const([1])], axis=0)
        combined = g.op("Concat", [scores, g.op("Expand", [per_head, shape])], axis=-1)
        probs = g.op("Softmax", [combined], axis=-1)
        return g.op("Slice", [probs, g.const([0]), g.const([-1]), g.const([-1])])


def visible_of(g: GraphBuilder, mask: str, dtype: np.dtype) -> str:
    """[B,C,K] bool: where an additive mask [B,1,1,C,K] (0: visible) shows a key."""
    seen = g.op("Equal", [mask, g.const(0.0, dtype)])
    return g.op("Squeeze", [seen, g.const([1, 2])])


def positions(g: GraphBuilder, past64: str, chunk: str) -> str:
    """[B,C] int64: each token's position, its row's past length (past64 [B] int64) plus
    its index in the chunk."""
    steps = g.op("Range", [g.const(0), g.op("Squeeze", [chunk, g.const([0])]), g.const(1)])
    return g.op("Add", [g.op("Unsqueeze", [past64, g.const([1])]), steps])


def mask_over(g: GraphBuilder, key_pos: str, positions: str, window: int | None,
              dtype: np.dtype) -> str:
    """The additive causal mask [B,1,1,C,K] of the keys at `key_pos` ([K] int64) for the
    queries at `positions` [B,C]: 0 where visible (within `window` where given), the
    dtype's minimum elsewhere."""
    query_pos = g.op("Unsqueeze", [positions, g.const([2])])  # [B,C,1]
    visible = g.op("LessOrEqual", [key_pos, query_pos])  # [B,C,cap]
    if window is not None:
        oldest = g.op("Sub", [query_pos, g.const(window - 1)])
        visible = g.op("And", [visible, g.op("GreaterOrEqual", [key_pos, oldest])])
    blocked = float(np.finfo(dtype).min)
    mask = g.op("Where", [visible, g.const(0.0, dtype), g.const(blocked, dtype)])
    return g.op("Unsqueeze", [mask, g.const([1, 2])])


def mask_key(window: int | None) -> str:
    return "mask" if window is None else f"mask.window{window}"


FLAVORS: dict[str, type[Flavor]] = {"ort": OrtFlavor, "standard": StandardFlavor}


def flavor_class(name: str) -> type[Flavor]:
    if name not in FLAVORS:
        raise ExportError(f"unknown flavor {name!r}; choose one of: {', '.join(FLAVORS)}")
    return FLAVORS[name]
