"""Inkling's layer (transformers 5.24's InklingDecoderLayer), emitted whole.

  h = n1(x)
  q, k, v, r = projections of h; k = c_k(k), v = c_v(v)   residual short convolutions
  q, k RMS-normed per head; scores q.k / head_dim + bias; no rotary
  x += c_a(o_proj(attention)); x += c_m(mlp(n2(x)))

Each c is a depthwise causal convolution over time plus its input (InklingShortConvolution),
its state the last L-1 inputs before the chunk (causal_conv.py). The four states of a layer
travel as one `past_conv.{i}` [B, 2 KV D + 2 hidden, L-1]: k's, v's, the attention
output's, the MLP output's channels in that order. Because c_a and c_m read the tokens
before each one, the last layer's output projection and MLP run on every token of the
chunk (other families cut them to each row's last token).

The bias (InklingRelativeLogits): each query's relative states r [H, d_rel] times the
layer's bank `proj` [d_rel, E] give one bias per backward distance 0..E-1; key t gets the
one at distance q - t, zero outside [0, E) (E = rel_extent; a sliding layer's, its window).
Built per layer and call as [B, H, C, K] over the K keys the flavour's attention reads (the
cache's capacity, or the op's total): one more tensor of the scores' size (design.md).

The experts (InklingMoE): the top k of sigmoid(logits) + e_score_correction_bias choose;
the chosen logits and the shared experts' (the router's last rows) are weighed together by
softmax(log-sigmoid(.)), times route_scale and the router's global_scale; the shared
experts' weights scale their SwiGLUs (stacked [S, I, H]). Dense MLPs are times their
global_scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, kv_names, state_names
from edgeprefill.errors import ExportError
from edgeprefill.export.causal_conv import CausalConv

if TYPE_CHECKING:
    from edgeprefill.export.decoder import DecoderBuilder, Rows
    from edgeprefill.export.flavors import StepTensors
    from edgeprefill.export.layer_attention import LayerAttention

ATTN = "self_attn."


@dataclass(frozen=True)
class InklingShape:
    """d_rel, rel_extent (the full layers' reach), conv_kernel_size, route_scale,
    n_shared_experts."""

    d_rel: int
    rel_extent: int
    conv_kernel: int
    route_scale: float
    shared: int


def read_inkling(raw: dict[str, Any]) -> InklingShape:
    shape = InklingShape(d_rel=int(raw["d_rel"]), rel_extent=int(raw["rel_extent"]),
                         conv_kernel=int(raw["conv_kernel_size"]),
                         route_scale=float(raw["route_scale"]),
                         shared=int(raw["n_shared_experts"]))
    if min(shape.d_rel, shape.rel_extent) < 1:
        raise ExportError(f"config.json: d_rel and rel_extent must be positive, got "
                          f"{shape.d_rel} and {shape.rel_extent}")
    return shape


def inkling_heads(raw: dict[str, Any], layers: tuple[LayerAttention, ...]
                  ) -> tuple[LayerAttention, ...]:
    """The sliding layers' own heads (swa_num_attention_heads, swa_num_key_value_heads,
    swa_head_dim) and scale (1 / swa_head_dim, as ModelConfig.attn_scale times theirs)."""
    d, swa_d = int(raw["head_dim"]), int(raw["swa_head_dim"])
    heads, kv = int(raw["swa_num_attention_heads"]), int(raw["swa_num_key_value_heads"])
    if kv < 1 or heads % kv:
        raise ExportError(f"config.json: swa_num_attention_heads ({heads}) must be a multiple "
                          f"of swa_num_key_value_heads ({kv})")
    return tuple(replace(layer, heads=heads, kv_heads=kv, head_dim=swa_d, scale=d / swa_d)
                 if layer.window is not None else layer for layer in layers)


class InklingLayers:
    """Emits Inkling's layers. `builder` is the DecoderBuilder."""

    def __init__(self, builder: DecoderBuilder, conv: CausalConv) -> None:
        self.b, self.conv = builder, conv
        assert builder.cfg.inkling is not None
        self.shape: InklingShape = builder.cfg.inkling
        self.width = self.shape.conv_kernel - 1

    def _channels(self, i: int) -> tuple[int, int]:
        """(KV heads x head size, hidden) of layer i."""
        cfg = self.b.cfg.for_layer(i)
        return cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size

    def states(self, layer: int) -> list:
        kv, hidden = self._channels(layer)
        return [(state_names(layer, CONV), self.b.dtype,
                 [BATCH, 2 * kv + 2 * hidden, self.width])]

    def layer(self, i: int, x: str, step: StepTensors, rows: Rows) -> str:
        """Layer i on the residual stream x (the tokens' layout); returns its `rows`."""
        b, g = self.b, self.b.g
        p = b.names.layer.format(i=i)
        kv, hidden = self._channels(i)
        past = state_names(i, CONV)
        bounds = np.cumsum([0, kv, kv, hidden, hidden])
        parts = [g.op("Slice", [past.past, g.const([int(bounds[j])]),
                                g.const([int(bounds[j + 1])]), g.const([1])])
                 for j in range(4)]
        newest: list[str] = []
        attn = self._attention(i, p, b._norm(x, p + "input_layernorm"), step, parts, newest)
        x = g.op("Add", [x, self._sconv(attn, p + "attn_sconv.conv1d.weight", parts[2],
                                        hidden, newest)])
        mlp = self._mlp(p, b._norm(x, p + "post_attention_layernorm"))
        x = g.op("Add", [x, self._sconv(mlp, p + "mlp_sconv.conv1d.weight", parts[3],
                                        hidden, newest)])
        g.op("Transpose", [g.op("Concat", newest, axis=2)], [past.present], perm=[0, 2, 1])
        return rows(x)

    def _sconv(self, x: str, weight: str, past: str, channels: int, newest: list[str],
               spread: bool = True) -> str:
        """x + conv(x) over time (x in the tokens' layout, or [B, C, ch] with spread
        False), the chunk's newest inputs appended to `newest`."""
        b = self.b
        b.w.check_shapes([(weight, (channels, 1, self.shape.conv_kernel))],
                         f"{channels} channels, conv_kernel_size {self.shape.conv_kernel}")
        xs = b.tokens.spread(x) if spread else x
        full = self.conv.full(past, xs)
        newest.append(self.conv.newest(full, self.width, channels))
        taps = self.conv.taps(weight, self.shape.conv_kernel, channels,
                              lambda n: b.ckpt.get(n, np.float32))
        out = b.g.op("Add", [self.conv.convolve(full, taps, self.shape.conv_kernel), xs])
        return b.tokens.gather(out, channels) if spread else out

    def _attention(self, i: int, p: str, h: str, step: StepTensors, parts: list[str],
                   newest: list[str]) -> str:
        b, g = self.b, self.b.g
        cfg, layer = b.cfg.for_layer(i), b.cfg.layers[i]
        heads, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        hidden, rel = cfg.hidden_size, self.shape.d_rel
        b.w.check_shapes([(p + ATTN + name + ".weight", (rows, hidden)) for name, rows in
                          (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d),
                           ("r_proj", heads * rel))], f"{heads} heads of {d}, {kv} KV heads, "
                         f"d_rel {rel}")
        q, k, v, r = (b.tokens.spread(b.w.linear(h, [p + ATTN + name + ".weight"], None))
                      for name in ("q_proj", "k_proj", "v_proj", "r_proj"))
        k = self._sconv(k, p + ATTN + "k_sconv.conv1d.weight", parts[0], kv * d, newest,
                        spread=False)
        v = self._sconv(v, p + ATTN + "v_sconv.conv1d.weight", parts[1], kv * d, newest,
                        spread=False)
        q = b._head_norm(q, heads, p + ATTN + "q_norm", d)
        k = b._head_norm(k, kv, p + ATTN + "k_norm", d)
        names = kv_names(i)
        flavor = b._flavor_for(cfg)
        extent = layer.window if layer.window is not None else self.shape.rel_extent
        bias = self._bias(p, r, heads, extent, step,
                          flavor.key_positions(g, step, names.past_key))
        out = flavor.attention(g, q, k, v, (names.past_key, names.past_value),
                               (names.present_key, names.present_value), step, layer,
                               bias=bias)
        out = b.tokens.gather(out, heads * d)
        return b.w.linear(out, [p + ATTN + "o_proj.weight"], None)

    def _bias(self, p: str, r: str, heads: int, extent: int, step: StepTensors,
              key_pos: str) -> str:
        """[B, H, C, K]: each query's bias of the keys at `key_pos` [K] (int64) from its
        relative states r [B, C, H * d_rel]."""
        from edgeprefill.export.flavors import positions  # (flavors imports ModelConfig)

        b, g = self.b, self.b.g
        name = p + ATTN + "rel_logits_proj.proj"
        b.w.check_shapes([(name, (self.shape.d_rel, extent))],
                         f"d_rel {self.shape.d_rel}, reach {extent}")
        per_head = g.op("Reshape", [r, g.const([0, 0, heads, self.shape.d_rel])])
        table = g.op("Transpose", [g.op("MatMul", [per_head, b.w.tensor(name)])],
                     perm=[0, 2, 1, 3])  # [B, H, C, E]
        at = positions(g, g.op("Cast", [step.past_lens], to=7), step.chunk)  # [B, C]
        distance = g.op("Sub", [g.op("Unsqueeze", [at, g.const([2])]), key_pos])  # [B,C,K]
        index = g.op("Unsqueeze", [g.op("Clip", [distance, g.const(0), g.const(extent - 1)]),
                                   g.const([1])])  # [B, 1, C, K]
        wide = g.op("Concat", [g.op("Shape", [index], end=1), g.op("Shape", [table], start=1,
                                                                    end=2),
                               g.op("Shape", [index], start=2)], axis=0)
        gathered = g.op("GatherElements", [table, g.op("Expand", [index, wide])], axis=3)
        inside = g.op("And", [g.op("GreaterOrEqual", [distance, g.const(0)]),
                              g.op("Less", [distance, g.const(extent)])])
        return g.op("Where", [g.op("Unsqueeze", [inside, g.const([1])]), gathered,
                              g.const(0.0, b.dtype)])

    def _mlp(self, p: str, h: str) -> str:
        b, g = self.b, self.b.g
        if p not in b.expert_layers:
            name = p + "mlp.global_scale"
            b.w.check_shapes([(name, (1,))], "one scale")
            return g.op("Mul", [b._dense_mlp(p, h), b.w.tensor(name)])
        return self._experts(p, h)

    def _experts(self, p: str, h: str) -> str:
        b, g, s = self.b, self.b.g, self.shape
        moe = b.cfg.moe
        assert moe is not None and b.experts is not None
        hidden, k, experts = b.cfg.hidden_size, moe.top_k, moe.experts
        x = g.op("Reshape", [h, g.const([-1, hidden])])  # [N, H]
        x32 = x if b.dtype == np.float32 else g.op("Cast", [x], to=1)
        router = p + "mlp.gate.weight"
        b.w.check_shapes([(router, (experts + s.shared, hidden))],
                         f"{experts} experts and {s.shared} shared")
        weight = g.weight(router + ".t", (hidden, experts + s.shared), np.float32,
                          lambda: np.ascontiguousarray(b.ckpt.get(router, np.float32).T))
        logits = g.op("MatMul", [x32, weight])  # [N, E + S]
        routed = g.op("Slice", [logits, g.const([0]), g.const([experts]), g.const([1])])
        shared = g.op("Slice", [logits, g.const([experts]), g.const([experts + s.shared]),
                                g.const([1])])
        bias = p + "mlp.gate.e_score_correction_bias"
        b.w.check_shapes([(bias, (experts,))], f"{experts} experts")
        scores = g.op("Add", [g.op("Sigmoid", [routed]),
                              g.weight(bias + ".f32", (experts,), np.float32,
                                       lambda: b.ckpt.get(bias, np.float32))])
        _, chosen = g.op("TopK", [scores, g.const([k])], 2, axis=-1)
        picked = g.op("Concat", [g.op("GatherElements", [routed, chosen], axis=1), shared],
                      axis=1)  # [N, k + S]
        log_sigmoid = g.op("Neg", [g.op("Softplus", [g.op("Neg", [picked])])])
        scale = p + "mlp.gate.global_scale"
        b.w.check_shapes([(scale, (1,))], "one scale")
        weights = g.op("Mul", [g.op("Softmax", [log_sigmoid], axis=-1), g.op("Mul", [
            g.weight(scale + ".f32", (1,), np.float32, lambda: b.ckpt.get(scale, np.float32)),
            g.const(s.route_scale, np.float32)])])
        if b.dtype != np.float32:
            weights = g.op("Cast", [weights], to=10)
        top = g.op("Slice", [weights, g.const([0]), g.const([k]), g.const([1])])
        out = b.experts.routed(p, x, chosen, top)
        for j in range(s.shared):
            gamma = g.op("Slice", [weights, g.const([k + j]), g.const([k + j + 1]),
                                   g.const([1])])
            out = g.op("Add", [out, self._shared(p, x, j, gamma)])
        return g.op("Reshape", [out, g.op("Shape", [h])])

    def _shared(self, p: str, x: str, j: int, gamma: str) -> str:
        """Shared expert j's SwiGLU of x [N, H], its activation times gamma [N, 1]."""
        b, g = self.b, self.b.g
        m = p + "mlp.shared_experts."
        hidden, width = b.cfg.hidden_size, b.cfg.moe.width if b.cfg.moe else 0
        b.w.check_shapes([(m + "gate_proj", (self.shape.shared, width, hidden)),
                          (m + "up_proj", (self.shape.shared, width, hidden)),
                          (m + "down_proj", (self.shape.shared, hidden, width))],
                         f"{self.shape.shared} shared experts of width {width}")

        def part(name: str, shape: tuple[int, int]) -> str:
            return g.weight(f"{m}{name}.{j}.t", shape, b.dtype, lambda: np.ascontiguousarray(
                b.ckpt.get(m + name, np.float32)[j].T).astype(b.dtype))

        gate = g.op("MatMul", [x, part("gate_proj", (hidden, width))])
        up = g.op("MatMul", [x, part("up_proj", (hidden, width))])
        act = g.op("Mul", [g.op("Mul", [b._activation(gate), up]), gamma])
        return g.op("MatMul", [act, part("down_proj", (width, hidden))])
