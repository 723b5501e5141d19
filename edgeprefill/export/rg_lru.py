"""RecurrentGemma's recurrent blocks (Griffin's RG-LRU) as stock ONNX ops, with their two
states.

transformers' RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru:

  y          = act(linear_y(h))                                   [lru_width]
  x          = causal depthwise conv of L tokens over linear_x(h)  state 1: its last L-1
               (conv1d_width, biased, no activation)
  i, r       = sigmoid(x W_i + b_i), sigmoid(x W_r + b_r)          block-diagonal: one
                                                                  [w, w] block per head
  log a      = -8 r softplus(recurrent_param)
  per token:   h = a h + x i sqrt(1 - a^2)                        state 2: h, float32
               (at position 0: h = x i, the state reset and the     [lru_width]
               multiplier 1)
  out        = linear_out(h * y)

A row's first chunk reads its state as zeros (RecurrentMixer.continues), which is the
reset; only the multiplier needs the position. Padding gets a = 1 and no input, so the
state stays as it is. The recurrence runs token by token in a `Scan` of its own body.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, state_names
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.mixer_shapes import LruShape
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.recurrent_mixer import RecurrentMixer
from edgeprefill.export.short_conv import StateSpec
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

F32 = np.dtype(np.float32)


class RgLru(RecurrentMixer):
    """Emits RG-LRU recurrent blocks; the values they all share are computed once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        super().__init__(g, w, cfg, tokens, conv, past_lens, valid_lens, chunk)
        assert cfg.lru is not None
        self.s: LruShape = cfg.lru
        starts = g.op("Equal", [past_lens, g.const(0, np.int32)])  # [B]
        column = g.op("Range", [g.const(0, np.int64), g.op("Squeeze", [chunk, g.const([0])]),
                                g.const(1, np.int64)])  # [C]
        # [B, C, 1] bool: the token is at position 0 (its row starts there)
        self.first = g.op("Unsqueeze", [g.op("And", [
            g.op("Unsqueeze", [starts, g.const([1])]),
            g.op("Unsqueeze", [g.op("Equal", [column, g.const(0, np.int64)]), g.const([0])])]),
            g.const([2])])
        # [B, 1] bool: the row continues a sequence (else its state reads as zeros)
        self.row_continues = g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(0, np.int32)]),
                                                g.const([1])])

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's conv state (model dtype) and recurrent state (float32)."""
        s = self.s
        return [(state_names(layer, CONV), self.w.dtype, [BATCH, s.width, s.conv_kernel - 1]),
                (state_names(layer, RECURRENT), F32, [BATCH, s.width])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The recurrent block of layer prefix `p` on its normed input `h`. `rows` keeps the
        tokens that go on."""
        g, s, pre = self.g, self.s, p + self.cfg.spec.names.lru
        self._check_shapes(pre)
        y = self._activation(self.w.linear(h, [pre + "linear_y.weight"], pre + "linear_y.bias"))
        x = self.tokens.spread(self.w.linear(h, [pre + "linear_x.weight"], pre + "linear_x.bias"))
        conv_state = state_names(layer, CONV)
        full = self.conv.full(conv_state.past, x)
        self.conv.store(full, conv_state.present, s.conv_kernel - 1, s.width)
        taps = self.conv.taps(pre + "conv_1d.weight", s.conv_kernel, s.width,
                              lambda n: self.w.ckpt.get(n, np.float32))
        x = self.conv.convolve(full, taps, s.conv_kernel, self.w.tensor(pre + "conv_1d.bias"))
        out = self._recurrence(pre + "rg_lru.", layer, self._float(x))  # [B, C, W] float32
        out = rows(self.tokens.gather(self._cast(out, self.w.dtype), s.width))
        return self.w.linear(g.op("Mul", [out, rows(y)]), [pre + "linear_out.weight"],
                             pre + "linear_out.bias")

    def _recurrence(self, pre: str, layer: int, x: str) -> str:
        """[B, C, W] float32: the RG-LRU over the chunk's tokens from the layer's state
        (zeros at position 0), its last value written to the state's present output."""
        g = self.g
        log_a = g.op("Mul", [self._gate(pre, "recurrent", x), self._log_decay(pre)])
        a = g.op("Exp", [log_a])
        multiplier = g.op("Sqrt", [g.op("Sub", [g.const(1.0, np.float32), g.op(
            "Exp", [g.op("Mul", [log_a, g.const(2.0, np.float32)])])])])
        multiplier = g.op("Where", [self.first, g.const(1.0, np.float32), multiplier])
        update = g.op("Mul", [g.op("Mul", [x, self._gate(pre, "input", x)]), multiplier])
        a = g.op("Where", [self.valid, a, g.const(1.0, np.float32)])
        update = g.op("Where", [self.valid, update, g.const(0.0, np.float32)])
        state = state_names(layer, RECURRENT)
        kept = g.op("Where", [self.row_continues, state.past, g.const(0.0, np.float32)])
        final, out = g.op("Scan", [kept, a, update], 2, num_scan_inputs=2,
                          scan_input_axes=[1, 1], scan_output_axes=[1],
                          body=_step_body(f"rglru{layer}_", self.s.width))
        g.op("Identity", [final], [state.present])
        return out

    def _gate(self, pre: str, kind: str, x: str) -> str:
        """[B, C, W] float32: sigmoid of x's block-diagonal projection by
        `{kind}_gate_weight` [heads, w, w] (stored [in, out]) plus its bias."""
        g, s = self.g, self.s
        block = s.width // s.heads
        weight = self._f32(pre + f"{kind}_gate_weight", (s.heads, block, block))
        per_head = g.op("Unsqueeze", [g.op("Reshape", [x, g.const([0, 0, s.heads, block])]),
                                      g.const([3])])  # [B, C, heads, 1, w]
        projected = g.op("Reshape", [g.op("MatMul", [per_head, weight]),
                                     g.const([0, 0, s.width])])
        bias = g.weight(pre + f"{kind}_gate_bias.flat", (s.width,), np.float32,
                        lambda: self.w.ckpt.get(pre + f"{kind}_gate_bias", np.float32)
                        .reshape(-1))
        return g.op("Sigmoid", [g.op("Add", [projected, bias])])

    def _log_decay(self, pre: str) -> str:
        """[W] float32: -8 softplus(recurrent_param), which times the recurrence gate is
        log a."""
        name = pre + "recurrent_param"

        def read() -> np.ndarray:
            param = self.w.ckpt.get(name, np.float32)
            return (-8.0 * np.logaddexp(0.0, param)).astype(np.float32)

        return self.g.weight(name + ".log_decay", (self.s.width,), np.float32, read)

    def _activation(self, x: str) -> str:
        """The y branch's activation: the model's hidden_activation (gelu_tanh on the Hub)."""
        kind = self.cfg.activation
        if kind == "silu":
            return self._silu(x)
        return self.g.op("Gelu", [x], approximate="tanh" if kind == "gelu_tanh" else "none")

    def _f32(self, name: str, shape: tuple[int, ...]) -> str:
        return self.g.weight(name + ".f32", shape, np.float32,
                             lambda: self.w.ckpt.get(name, np.float32))

    def _check_shapes(self, pre: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        s, hidden = self.s, self.cfg.hidden_size
        block = s.width // s.heads
        self.w.check_shapes(((pre + "linear_x.weight", (s.width, hidden)),
                            (pre + "linear_y.weight", (s.width, hidden)),
                            (pre + "conv_1d.weight", (s.width, 1, s.conv_kernel)),
                            (pre + "rg_lru.input_gate_weight", (s.heads, block, block)),
                            (pre + "rg_lru.recurrent_gate_weight", (s.heads, block, block)),
                            (pre + "rg_lru.recurrent_param", (s.width,)),
                            (pre + "linear_out.weight", (hidden, s.width))),
            f"lru_width {s.width} in {s.heads} heads, conv1d_width {s.conv_kernel}")


def _step_body(prefix: str, width: int) -> Any:
    """The Scan's body, one token: h = a h + update, float32 [B, W]; y is h."""
    body = GraphBuilder(prefix)
    shape = [BATCH, width]
    h = body.input(prefix + "h", F32, shape)
    a = body.input(prefix + "a", F32, shape)
    update = body.input(prefix + "update", F32, shape)
    h = body.op("Add", [body.op("Mul", [a, h]), update], [prefix + "h_out"])
    body.op("Identity", [h], [prefix + "y"])
    body.output(prefix + "h_out", F32, shape)
    body.output(prefix + "y", F32, shape)
    return body.to_graph(prefix + "step")
