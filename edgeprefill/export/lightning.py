"""MiniMax's lightning attention (MiniMax-Text-01, MiniMax-M1) as stock ONNX ops, with its
one state.

transformers' MiniMaxLightningAttention (heads = num_attention_heads of head_dim D):

  q, k, v    = split(silu(qkv_proj(h))) per head              (no scale, no rotary)
  s          = each head's slope: (2^(-8/heads))^(head + 1) times
               (1 - layer / (num_hidden_layers - 1 + 1e-5) + 1e-5)
  per token t: S = exp(-s) S + k_t (x) v_t                     S: [heads, D, D], float32
               o_t = q_t S
  out        = out_proj(rmsnorm(o) * norm.weight * sigmoid(output_gate(h)))
               (the norm over all heads at once, epsilon 1e-6)

transformers runs a prompt in blocks of block_size and later tokens one by one; both are
this recurrence. The bundle runs each chunk in one closed form, exact for any chunk (no
Scan): with S the state before the chunk and L the row's valid tokens,

  o_t   = exp(-s (t + 1)) q_t S + sum_{j <= t} exp(-s (t - j)) (q_t . k_j) v_j
  S'    = exp(-s L) S + sum_{j < L} exp(-s (L - 1 - j)) k_j (x) v_j

A row's padding (t >= L) has a weight of 0 in S', so the state it writes is the one at
its last valid token (no valid token reads a later one within the chunk). The state reads
as zeros where past_lens is 0 and goes to its `present_recurrent` output.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.contract import BATCH, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

NORM_EPS = 1e-6  # MiniMaxRMSNorm's default, which the lightning layers' norm keeps
QKV, OUT, GATE, NORM = "qkv_proj", "out_proj", "output_gate", "norm"  # under self_attn.
SLOPES = "slope_rate"  # transformers' buffer, saved beside the weights


def slopes(heads: int, layer: int, num_layers: int) -> np.ndarray:
    """[heads] float32: each head's decay rate in `layer`, as get_slope_rate computes it."""
    base = 1 / (2 ** (8 / heads))
    rate = (np.float32(base) ** np.arange(1, heads + 1, dtype=np.float32)).astype(np.float32)
    factor = 1 - layer / (num_layers - 1 + 1e-5) + 1e-5
    return (rate * np.float32(factor)).astype(np.float32)


class LightningAttention(RecurrentMixer):
    """Emits lightning attention layers."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        self.valid_lens = valid_lens  # [B] int32: the next state ends at each row's last

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's one state, float32 whatever the model's dtype."""
        d = self.cfg.head_dim
        return [(state_names(layer, RECURRENT), np.dtype(np.float32),
                 [BATCH, self.cfg.num_heads, d, d])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The lightning sublayer of layer prefix `p` on its normed input `h`; `rows` keeps
        the tokens that go on."""
        g, heads, d = self.g, self.cfg.num_heads, self.cfg.head_dim
        pre, size = p + "self_attn.", self.cfg.num_heads * self.cfg.head_dim
        self._check_shapes(pre)
        qkv = self._silu(self.w.linear(h, [pre + QKV + ".weight"], None))
        qkv = g.op("Reshape", [self._float(self.tokens.spread(qkv)),
                               g.const([0, 0, heads, 3 * d])])
        q, k, v = (g.op("Transpose", [x], perm=[0, 2, 1, 3]) for x in  # [B, heads, C, D]
                   g.op("Split", [qkv, g.const([d, d, d])], 3, axis=-1))
        out = self._attend(layer, self._rates(pre, layer), q, k, v)  # [B, heads, C, D]
        out = g.op("Reshape", [g.op("Transpose", [out], perm=[0, 2, 1, 3]),
                               g.const([0, 0, size])])
        y = self._normed(pre, rows(self.tokens.gather(self._cast(out, self.w.dtype), size)))
        gate = g.op("Sigmoid", [self.w.linear(rows(h), [pre + GATE + ".weight"], None)])
        return self.w.linear(g.op("Mul", [gate, y]), [pre + OUT + ".weight"], None)

    def _rates(self, pre: str, layer: int) -> str:
        """[heads, 1, 1] float32: the checkpoint's slope_rate buffer where it holds one (as
        transformers loads it), else the slopes transformers computes."""
        rates = slopes(self.cfg.num_heads, layer, self.cfg.num_layers)
        if self.w.ckpt.has(pre + SLOPES):
            self.w.check_shapes([(pre + SLOPES, (self.cfg.num_heads, 1, 1))],
                                f"num_attention_heads {self.cfg.num_heads}")
            rates = self.w.ckpt.get(pre + SLOPES, np.float32)
        return self.g.const(rates.reshape(-1, 1, 1), np.float32)

    def _attend(self, layer: int, rate: str, q: str, k: str, v: str) -> str:
        """The chunk's outputs [B, heads, C, D] float32 (module docstring), the next state
        written to the layer's present output; `rate`: each head's s [heads, 1, 1]."""
        g = self.g
        state = state_names(layer, RECURRENT)
        past = g.op("Where", [self.continues, state.past, g.const(0.0, np.float32)])
        t = self._positions(q)  # [C] float32
        gap = g.op("Sub", [g.op("Unsqueeze", [t, g.const([1])]),
                           g.op("Unsqueeze", [t, g.const([0])])])  # [C, C]: t - j
        decay = g.op("Where", [g.op("GreaterOrEqual", [gap, g.const(0.0, np.float32)]),
                               g.op("Exp", [g.op("Mul", [g.op("Neg", [rate]), g.op(
                                   "Relu", [gap])])]),
                               g.const(0.0, np.float32)])  # [heads, C, C]
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              decay])
        within = g.op("MatMul", [scores, v])
        query_decay = g.op("Exp", [g.op("Mul", [g.op("Neg", [rate]), g.op("Unsqueeze", [
            g.op("Add", [t, g.const(1.0, np.float32)]), g.const([1])])])])  # [heads, C, 1]
        before = g.op("MatMul", [g.op("Mul", [q, query_decay]), past])
        self._next_state(rate, k, v, past, state.present)
        return g.op("Add", [before, within])

    def _next_state(self, rate: str, k: str, v: str, past: str, present: str) -> None:
        """S' = exp(-s L) S + sum_{j < L} exp(-s (L - 1 - j)) k_j (x) v_j per row."""
        g = self.g
        lens = g.op("Cast", [self.valid_lens], to=1)  # [B] float32
        lens = g.op("Reshape", [lens, g.const([-1, 1, 1, 1])])  # [B, 1, 1, 1]
        t = g.op("Reshape", [self._positions(k), g.const([1, 1, -1, 1])])  # [1, 1, C, 1]
        left = g.op("Sub", [g.op("Sub", [lens, g.const(1.0, np.float32)]), t])  # L - 1 - j
        rate4 = g.op("Unsqueeze", [rate, g.const([0])])  # [1, heads, 1, 1]
        weight = g.op("Where", [g.op("GreaterOrEqual", [left, g.const(0.0, np.float32)]),
                                g.op("Exp", [g.op("Mul", [g.op("Neg", [rate4]), g.op(
                                    "Relu", [left])])]),
                                g.const(0.0, np.float32)])  # [B, heads, C, 1]
        added = g.op("MatMul", [g.op("Transpose", [g.op("Mul", [k, weight])],
                                     perm=[0, 1, 3, 2]), v])  # [B, heads, D, D]
        kept = g.op("Exp", [g.op("Mul", [g.op("Neg", [rate4]), lens])])  # [B, heads, 1, 1]
        g.op("Add", [g.op("Mul", [past, kept]), added], [present])

    def _positions(self, x: str) -> str:
        """[C] float32: 0 .. C-1 over axis 2 of x [B, heads, C, D]."""
        g = self.g
        count = g.op("Squeeze", [g.op("Slice", [g.op("Shape", [x]), g.const([2]),
                                                g.const([3])]), g.const([0])])
        return g.op("Range", [g.const(0.0, np.float32), g.op("Cast", [count], to=1),
                              g.const(1.0, np.float32)])

    def _normed(self, pre: str, x: str) -> str:
        """MiniMaxRMSNorm over all heads (model dtype in, float32 inside, as transformers)."""
        g = self.g
        f = self._float(x)
        mean = g.op("ReduceMean", [g.op("Mul", [f, f]), g.const([-1])], keepdims=1)
        normed = g.op("Div", [f, g.op("Sqrt", [g.op("Add", [mean, g.const(NORM_EPS,
                                                                          np.float32)])])])
        return g.op("Mul", [self.w.tensor(pre + NORM + ".weight"),
                            self._cast(normed, self.w.dtype)])

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        hidden, size = self.cfg.hidden_size, self.cfg.num_heads * self.cfg.head_dim
        self.w.check_shapes([(pre + QKV + ".weight", (3 * size, hidden)),
                             (pre + GATE + ".weight", (size, hidden)),
                             (pre + OUT + ".weight", (hidden, size)),
                             (pre + NORM + ".weight", (size,))],
                            f"num_attention_heads {self.cfg.num_heads} of head_dim "
                            f"{self.cfg.head_dim}")
