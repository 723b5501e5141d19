"""xLSTM's mLSTM cell (transformers' xLSTMLayer, weight_mode "single") as stock ONNX ops,
with its one state.

  q, k, v, o   = q(h), k(h), v(h), ogate_preact(h)           H heads: q, k of D, v of V
  i, f         = cap tanh(igate_preact(h) / cap),             one per head (cap:
                 cap tanh(fgate_preact(h) / cap)              gate_soft_cap)
  per token t (mlstm_recurrent_step_native, float32):
                 m' = max(logsigmoid(f) + m, i)              state: C [D, V], n [D], m
                 a, b = e^(logsigmoid(f) + m - m'), e^(i - m')
                 C = a C + b k (x) v       n = a n + b k       m = m'
                 h_t = (q / sqrt(D)) C / (max(|(q / sqrt(D)) . n|, e^-m) + eps)
  out          = out_proj(sigmoid(o) * multihead_norm(h))    a LayerNorm over each head's
                                                             V, without affine, then
                                                             the norm's weight over H x V

transformers runs a prompt shorter than its chunk_size through this step, token by token
(mlstm_recurrent_sequence_native); a longer one through a chunkwise form in
autocast_kernel_dtype (bfloat16 by default) that equals it up to rounding. The step is
the truth here, run in a `Scan` over the chunk.

The state, float32 whatever the model's dtype, is one tensor per layer
[B, H, D, V + 2]: C in its first V columns, n in column V, m in column V + 1 (m repeated
down the D rows, so that every update is one broadcast). A row's first chunk reads zeros
(transformers' xLSTMCache starts C, n and m at 0); padding leaves the state as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.mixer_shapes import MlstmShape
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

F32 = np.dtype(np.float32)
MIXER = "mlstm_layer."  # the cell's module under the layer prefix


class Mlstm(RecurrentMixer):
    """Emits mLSTM cells; the values they all share are computed once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        assert cfg.mlstm is not None
        self.s: MlstmShape = cfg.mlstm
        # [B, C, 1, 1, 1]: the Scan reads each token's validity as [B, 1, 1, 1]
        self.valid_4d = g.op("Unsqueeze", [self.valid, g.const([3, 4])])

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's C | n | m state (float32)."""
        s = self.s
        return [(state_names(layer, RECURRENT), F32,
                 [BATCH, s.heads, s.key_dim, s.value_dim + 2])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The mLSTM sublayer of layer prefix `p` on its normed input `h`; `rows` keeps the
        tokens that go on."""
        g, s = self.g, self.s
        pre = p + MIXER
        self._check_shapes(pre)
        qk, width = s.heads * s.key_dim, s.heads * s.value_dim
        projected = self.w.linear(h, [pre + n + ".weight" for n in ("q", "k", "v")], None)
        q, k, v = (self._heads(t, size) for t, size in zip(g.op("Split", [
            self.tokens.spread(projected), g.const([qk, qk, width])], 3, axis=-1),
            (s.key_dim, s.key_dim, s.value_dim), strict=True))
        gates = self.w.linear(h, [pre + "igate_preact.weight", pre + "fgate_preact.weight"],
                              pre + "gates.bias")  # igate's and fgate's biases
        capped = self._soft_cap(self._float(self.tokens.spread(gates)), s.gate_cap)
        i, f = (g.op("Reshape", [t, g.const([0, 0, s.heads, 1, 1])])  # [B, C, H, 1, 1]
                for t in g.op("Split", [capped, g.const([s.heads, s.heads])], 2, axis=-1))
        cell = self._recurrence(layer, q, k, v, i, f)  # [B, C, H, V] float32
        normed = self._head_norm(pre, cell)
        gate = g.op("Sigmoid", [self.w.linear(rows(h), [pre + "ogate_preact.weight"], None)])
        y = g.op("Mul", [gate, rows(self.tokens.gather(normed, width))])
        return self.w.linear(y, [pre + "out_proj.weight"], None)

    def _heads(self, x: str, size: int) -> str:
        """[B, C, H * size] (model dtype) -> [B, C, H, size] float32."""
        return self.g.op("Reshape", [self._float(x), self.g.const([0, 0, self.s.heads, size])])

    def _soft_cap(self, x: str, cap: float | None) -> str:
        g = self.g
        if cap is None:
            return x
        return g.op("Mul", [g.op("Tanh", [g.op("Div", [x, g.const(cap, F32)])]),
                            g.const(cap, F32)])

    def _recurrence(self, layer: int, q: str, k: str, v: str, i: str, f: str) -> str:
        """[B, C, H, V] float32: the cell's output per token from the layer's state (zeros
        where the row starts), its value after the last valid token written to the state's
        present output."""
        g, s = self.g, self.s
        state = state_names(layer, RECURRENT)
        start = g.op("Where", [self.continues, state.past, g.const(0.0, F32)])
        scaled = g.op("Mul", [q, g.const(s.key_dim ** -0.5, F32)])
        last, out = g.op("Scan", [start, scaled, k, v, i, f, self.valid_4d], 2,
                         num_scan_inputs=6, scan_input_axes=[1] * 6, scan_output_axes=[1],
                         body=_step_body(f"mlstm{layer}_", s))
        g.op("Identity", [last], [state.present])
        return out

    def _head_norm(self, pre: str, cell: str) -> str:
        """xLSTMMultiHeadLayerNorm: each head's V channels layer-normed in float32 without
        affine, then [B, C, H x V] in the model's dtype times the norm's weight."""
        g, s = self.g, self.s
        ones = g.weight(f"mlstm.norm_ones.{s.value_dim}", (s.value_dim,), F32,
                        lambda: np.ones(s.value_dim, np.float32))
        zeros = g.weight(f"mlstm.norm_zeros.{s.value_dim}", (s.value_dim,), F32,
                         lambda: np.zeros(s.value_dim, np.float32))
        normed = g.op("LayerNormalization", [cell, ones, zeros], axis=-1,
                      epsilon=self.cfg.norm_eps)
        flat = g.op("Reshape", [self._cast(normed, self.w.dtype),
                                g.const([0, 0, s.heads * s.value_dim])])
        return g.op("Mul", [flat, self.w.tensor(pre + "multihead_norm.weight")])

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        s, hidden = self.s, self.cfg.hidden_size
        qk, width = s.heads * s.key_dim, s.heads * s.value_dim
        self.w.check_shapes((
            (pre + "q.weight", (qk, hidden)), (pre + "k.weight", (qk, hidden)),
            (pre + "v.weight", (width, hidden)), (pre + "ogate_preact.weight", (width, hidden)),
            (pre + "igate_preact.weight", (s.heads, hidden)),
            (pre + "igate_preact.bias", (s.heads,)),
            (pre + "fgate_preact.weight", (s.heads, hidden)),
            (pre + "fgate_preact.bias", (s.heads,)),
            (pre + "multihead_norm.weight", (width,)), (pre + "out_proj.weight", (hidden, width))),
            f"hidden_size {hidden}, num_heads {s.heads}, q/k {qk} and v {width} wide")


def _step_body(prefix: str, s: MlstmShape) -> Any:
    """The Scan's body, one token (mlstm_recurrent_step_native): the state
    [B, H, D, V + 2] updated where the token is valid (kept as it is on padding), and
    the cell's output [B, H, V]."""
    body = GraphBuilder(prefix)
    heads, dk, dv = s.heads, s.key_dim, s.value_dim
    old = body.input(prefix + "state", F32, [BATCH, heads, dk, dv + 2])
    q = body.input(prefix + "q", F32, [BATCH, heads, dk])  # already / sqrt(D)
    k = body.input(prefix + "k", F32, [BATCH, heads, dk])
    v = body.input(prefix + "v", F32, [BATCH, heads, dv])
    i = body.input(prefix + "i", F32, [BATCH, heads, 1, 1])
    f = body.input(prefix + "f", F32, [BATCH, heads, 1, 1])
    valid = body.input(prefix + "valid", np.bool_, [BATCH, 1, 1, 1])

    memory, m = body.op("Split", [old, body.const([dv + 1, 1])], 2, axis=-1)  # C | n, m
    log_f = body.op("Neg", [body.op("Softplus", [body.op("Neg", [f])])])  # logsigmoid(f)
    decayed = body.op("Add", [log_f, m])
    new_m = body.op("Max", [decayed, i])  # [B, H, D, 1], every row alike
    forget = body.op("Exp", [body.op("Sub", [decayed, new_m])])
    write = body.op("Exp", [body.op("Sub", [i, new_m])])
    # k (x) [v | 1]: the outer product's columns beside k itself, C's and n's updates at once
    v_one = body.op("Concat", [v, body.op("Expand", [body.const(1.0, F32), body.op(
        "Concat", [body.op("Slice", [body.op("Shape", [v]), body.const([0]), body.const([2])]),
                   body.const([1])], axis=0)])], axis=-1)  # [B, H, V + 1]
    outer = body.op("Mul", [body.op("Unsqueeze", [k, body.const([3])]),
                            body.op("Unsqueeze", [v_one, body.const([2])])])
    memory = body.op("Add", [body.op("Mul", [forget, memory]), body.op("Mul", [write, outer])])
    read = body.op("MatMul", [body.op("Unsqueeze", [q, body.const([2])]), memory])
    numerator, qn = body.op("Split", [read, body.const([dv, 1])], 2, axis=-1)  # [B,H,1,.]
    m_head = body.op("Slice", [new_m, body.const([0]), body.const([1]), body.const([2])])
    floor = body.op("Exp", [body.op("Neg", [m_head])])
    denominator = body.op("Add", [body.op("Max", [body.op("Abs", [qn]), floor]),
                                  body.const(s.eps, F32)])
    h = body.op("Div", [numerator, denominator])
    body.op("Squeeze", [h, body.const([2])], [prefix + "out"])
    new = body.op("Concat", [memory, new_m], axis=-1)
    body.op("Where", [valid, new, old], [prefix + "state_out"])
    body.output(prefix + "state_out", F32, [BATCH, heads, dk, dv + 2])
    body.output(prefix + "out", F32, [BATCH, heads, dv])
    return body.to_graph(prefix + "step")
