"""What the recurrent mixers (Qwen3.5's Gated DeltaNet, Mamba-2) share: the per-row masks
their recurrence over a chunk reads — whether a row continues a sequence (else its state
reads as zeros, so a reused slot never leaks its last one) and which of its tokens are
valid (padding leaves the state as it is) — and their float32 arithmetic."""

from __future__ import annotations

import numpy as np

from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import ONNX_DTYPE, GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights


class RecurrentMixer:
    """The base of a recurrent mixer's emitter; the values its layers share are computed
    once."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: ModelConfig,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv, past_lens: str,
                 valid_lens: str, chunk: str) -> None:
        self.g, self.w, self.cfg, self.tokens, self.conv = g, w, cfg, tokens, conv
        # [B, 1, 1, 1] bool: the row's past length is not 0
        self.continues = g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(0, np.int32)]),
                                            g.const([1, 2, 3])])
        column = g.op("Range", [g.const(0, np.int32), g.op("Cast", [
            g.op("Squeeze", [chunk, g.const([0])])], to=6), g.const(1, np.int32)])  # [C]
        # [B, C, 1] bool: token t of the row is one of its valid_lens first
        self.valid = g.op("Unsqueeze", [g.op("Less", [
            g.op("Unsqueeze", [column, g.const([0])]),
            g.op("Unsqueeze", [valid_lens, g.const([1])])]), g.const([2])])

    def _silu(self, x: str) -> str:
        return self.g.op("Mul", [x, self.g.op("Sigmoid", [x])])

    def _float(self, x: str) -> str:
        return self._cast(x, np.dtype(np.float32))

    def _cast(self, x: str, dtype: np.dtype) -> str:
        """x in `dtype`, from the model's dtype or float32 (nothing where they agree)."""
        if self.w.dtype == np.float32:
            return x
        return self.g.op("Cast", [x], to=ONNX_DTYPE[np.dtype(dtype)])
