"""LFM2's gated short convolution as plain ONNX ops, with its recurrent state.

transformers' Lfm2ShortConv: in_proj (hidden -> 3 x hidden) split into B, C and x; a
depthwise causal convolution over time of B*x with a kernel of L tokens (conv_L_cache);
C times that; out_proj. Causal means token t reads B*x of tokens t-L+1..t, so a chunk
needs the last L-1 values of B*x before it: the layer's state, `[B, hidden, L-1]` per row
(contract.py's `past_conv.{i}` and `present_conv.{i}`).

  state  = past_lens > 0 ? past_conv : 0          a reused slot never leaks its last state
  full   = concat(state, B*x) over time           [B, L-1+C, hidden]
  conv_t = sum_k w_k * full[t + k]                 exact at any chunk boundary
  new    = full[valid_len .. valid_len + L-2]     the L-1 values ending at the row's last
                                                  valid token: padding never enters it
Every op is a stock one (Slice, Mul, Sum, Concat, GatherElements, Where), so both flavours
share this code and no native kernel or fusing pass touches it.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.contract import StateNames
from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

CONV = "conv."  # the module under a layer's prefix: conv.in_proj, conv.conv, conv.out_proj


class ShortConv:
    """Emits conv layers; the values every conv layer shares are computed once per step."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, past_lens: str, valid_lens: str) -> None:
        self.g, self.w, self.cfg, self.tokens = g, w, cfg, tokens
        self.width = cfg.conv_kernel - 1  # state positions
        # [B, 1, 1]: whether the row continues a sequence (else its state reads as zeros)
        self.continues = g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(0, np.int32)]),
                                            g.const([1, 2])])
        # [B, L-1, hidden]: where each row's new state starts in `full` and runs on
        valid = g.op("Unsqueeze", [g.op("Cast", [valid_lens], to=7), g.const([1])])  # [B, 1]
        index = g.op("Add", [valid, g.const([list(range(self.width))])])  # [B, L-1]
        self.state_index = g.op("Expand", [g.op("Unsqueeze", [index, g.const([2])]),
                                           g.const([1, 1, cfg.hidden_size])])

    def layer(self, p: str, h: str, state: StateNames, rows) -> str:
        """The conv sublayer of layer prefix `p` on its normed input `h`; reads
        `state.past` and writes `state.present`. `rows` keeps the tokens that go on."""
        g, cfg = self.g, self.cfg
        self._check_shapes(p)
        bias = cfg.conv_bias
        bcx = self.w.linear(h, [p + CONV + "in_proj.weight"],
                            p + CONV + "in_proj.bias" if bias else None)
        b, c, x = g.op("Split", [self.tokens.spread(bcx)], 3, axis=-1, num_outputs=3)
        full = g.op("Concat", [self._past(state.past), g.op("Mul", [b, x])], axis=1)
        self._new_state(full, state.present)
        y = g.op("Mul", [c, self._convolve(p, full)])  # [B, C, hidden]
        y = rows(self.tokens.gather(y, cfg.hidden_size))
        return self.w.linear(y, [p + CONV + "out_proj.weight"],
                             p + CONV + "out_proj.bias" if bias else None)

    def _past(self, name: str) -> str:
        """[B, L-1, hidden]: the row's state, zeros where it starts a sequence."""
        g = self.g
        kept = g.op("Where", [self.continues, name, g.const(0.0, self.w.dtype)])
        return g.op("Transpose", [kept], perm=[0, 2, 1])

    def _new_state(self, full: str, present: str) -> None:
        g = self.g
        new = g.op("GatherElements", [full, self.state_index], axis=1)  # [B, L-1, hidden]
        g.op("Transpose", [new], [present], perm=[0, 2, 1])

    def _convolve(self, p: str, full: str) -> str:
        """[B, C, hidden]: token t is sum_k w_k * full[t + k] (full holds L-1 more)."""
        g, kernel = self.g, self.cfg.conv_kernel
        name = p + CONV + "conv.weight"  # [hidden, 1, L], as nn.Conv1d stores it
        taps = g.weight(name + ".taps", (kernel, self.cfg.hidden_size), self.w.dtype,
                        lambda: self.w.ckpt.get(name, np.float32)[:, 0, :].T
                        .astype(self.w.dtype))
        weights = g.op("Split", [taps], kernel, axis=0, num_outputs=kernel)  # [1, hidden] each
        big = np.iinfo(np.int64).max
        terms = []
        for k, weight in enumerate(weights):
            end = k - (kernel - 1) if k < kernel - 1 else big  # full[k : k + C]
            part = g.op("Slice", [full, g.const([k]), g.const([end]), g.const([1])])
            terms.append(g.op("Mul", [part, weight]))
        if self.cfg.conv_bias:
            terms.append(self.w.tensor(name.removesuffix(".weight") + ".bias"))
        return g.op("Sum", terms)

    def _check_shapes(self, p: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        hidden, kernel = self.cfg.hidden_size, self.cfg.conv_kernel
        for name, shape in ((p + CONV + "in_proj.weight", (3 * hidden, hidden)),
                            (p + CONV + "conv.weight", (hidden, 1, kernel))):
            if self.w.shape(name) != shape:
                raise ExportError(f"{name} has shape {self.w.shape(name)}, but config.json "
                                  f"implies {shape} (hidden {hidden}, conv_L_cache {kernel})")
