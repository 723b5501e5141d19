"""LFM2's gated short convolution as plain ONNX ops, with its recurrent state.

transformers' Lfm2ShortConv: in_proj (hidden -> 3 x hidden) split into B, C and x; a
depthwise causal convolution over time of B*x with a kernel of L tokens (conv_L_cache);
C times that; out_proj. Causal means token t reads B*x of tokens t-L+1..t, so a chunk
needs the last L-1 values of B*x before it: the layer's state, `[B, hidden, L-1]` per row
(contract.py's `past_conv.{i}` and `present_conv.{i}`), kept as causal_conv.py says.
Every op is a stock one, so both flavours share this code and no native kernel or fusing
pass touches it.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.contract import BATCH, CONV, StateNames, state_names
from edgeprefill.errors import ExportError
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

PREFIX = "conv."  # the module under a layer's prefix: conv.in_proj, conv.conv, conv.out_proj
StateSpec = tuple[StateNames, np.dtype, list]  # names, dtype, shape of one state


class ShortConv:
    """Emits conv layers."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv) -> None:
        self.g, self.w, self.cfg, self.tokens, self.conv = g, w, cfg, tokens, conv
        self.width = cfg.conv_kernel - 1  # state positions

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's state tensors, as the graph declares them."""
        return [(state_names(layer, CONV), self.w.dtype,
                 [BATCH, self.cfg.hidden_size, self.width])]

    def layer(self, p: str, h: str, layer: int, rows) -> str:
        """The conv sublayer of layer prefix `p` on its normed input `h`; reads and writes
        the layer's state. `rows` keeps the tokens that go on."""
        g, cfg = self.g, self.cfg
        self._check_shapes(p)
        state = state_names(layer, CONV)
        bias = cfg.conv_bias
        bcx = self.w.linear(h, [p + PREFIX + "in_proj.weight"],
                            p + PREFIX + "in_proj.bias" if bias else None)
        b, c, x = g.op("Split", [self.tokens.spread(bcx)], 3, axis=-1, num_outputs=3)
        full = self.conv.full(state.past, g.op("Mul", [b, x]))
        self.conv.store(full, state.present, self.width, cfg.hidden_size)
        y = g.op("Mul", [c, self._convolve(p, full)])  # [B, C, hidden]
        y = rows(self.tokens.gather(y, cfg.hidden_size))
        return self.w.linear(y, [p + PREFIX + "out_proj.weight"],
                             p + PREFIX + "out_proj.bias" if bias else None)

    def _convolve(self, p: str, full: str) -> str:
        kernel, name = self.cfg.conv_kernel, p + PREFIX + "conv.weight"
        taps = self.conv.taps(name, kernel, self.cfg.hidden_size,
                              lambda n: self.w.ckpt.get(n, np.float32))
        bias = self.w.tensor(name.removesuffix(".weight") + ".bias") if self.cfg.conv_bias \
            else None
        return self.conv.convolve(full, taps, kernel, bias)

    def _check_shapes(self, p: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        hidden, kernel = self.cfg.hidden_size, self.cfg.conv_kernel
        for name, shape in ((p + PREFIX + "in_proj.weight", (3 * hidden, hidden)),
                            (p + PREFIX + "conv.weight", (hidden, 1, kernel))):
            if self.w.shape(name) != shape:
                raise ExportError(f"{name} has shape {self.w.shape(name)}, but config.json "
                                  f"implies {shape} (hidden {hidden}, conv_L_cache {kernel})")
