"""A depthwise causal convolution over a chunk's tokens, exact across chunk boundaries,
with its recurrent state: the last L-1 inputs before the chunk (L = the kernel's width).

  state  = past_lens > 0 ? past : 0             a reused slot never leaks its last state
  full   = concat(state, x) over time           [B, L-1+C, channels]
  conv_t = sum_k w_k * full[t + k]               token t reads x of tokens t-L+1..t
  new    = full[valid_len .. valid_len + L-2]   the L-1 inputs ending at the row's last
                                                valid token: padding never enters it

The state crosses the graph boundary as [B, channels, L-1] (transformers' conv_state
layout). LFM2's short convolutions (short_conv.py) and Qwen3.5's Gated DeltaNet
(gated_delta.py) share it; every op is a stock one, so both flavours do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.export.graph import GraphBuilder


class CausalConv:
    """The values every convolution of a step shares, computed once."""

    def __init__(self, g: GraphBuilder, dtype: np.dtype, past_lens: str,
                 valid_lens: str) -> None:
        self.g, self.dtype = g, dtype
        # [B, 1, 1]: whether the row continues a sequence (else its state reads as zeros)
        self.continues = g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(0, np.int32)]),
                                            g.const([1, 2])])
        self.valid = g.op("Unsqueeze", [g.op("Cast", [valid_lens], to=7), g.const([1])])  # [B,1]
        self._indices: dict[tuple[int, int], str] = {}

    def full(self, past: str, x: str) -> str:
        """[B, L-1+C, channels]: the row's state (zeros where it starts a sequence), then
        `x` [B, C, channels]."""
        g = self.g
        kept = g.op("Where", [self.continues, past, g.const(0.0, self.dtype)])
        return g.op("Concat", [g.op("Transpose", [kept], perm=[0, 2, 1]), x], axis=1)

    def store(self, full: str, present: str, width: int, channels: int) -> None:
        """Write the `width` = L-1 values of `full` ending at each row's last valid token
        to the graph output `present` [B, channels, width]."""
        self.g.op("Transpose", [self.newest(full, width, channels)], [present], perm=[0, 2, 1])

    def newest(self, full: str, width: int, channels: int) -> str:
        """[B, width, channels]: the `width` = L-1 values of `full` ending at each row's
        last valid token (Inkling's layers concatenate several states' into one)."""
        return self.g.op("GatherElements", [full, self._index(width, channels)], axis=1)

    def convolve(self, full: str, taps: str, kernel: int, bias: str | None = None) -> str:
        """[B, C, channels]: token t is sum_k taps[k] * full[t + k] (+ bias); `taps` is
        [kernel, channels]."""
        g = self.g
        weights = g.op("Split", [taps], kernel, axis=0, num_outputs=kernel)  # [1, ch] each
        weights = [weights] if kernel == 1 else weights  # (ZAYA's cca_time0 may be 1)
        big = np.iinfo(np.int64).max
        terms = []
        for k, weight in enumerate(weights):
            end = k - (kernel - 1) if k < kernel - 1 else big  # full[k : k + C]
            part = g.op("Slice", [full, g.const([k]), g.const([end]), g.const([1])])
            terms.append(g.op("Mul", [part, weight]))
        if bias is not None:
            terms.append(bias)
        return g.op("Sum", terms)

    def taps(self, name: str, kernel: int, channels: int,
             read: Callable[[str], np.ndarray]) -> str:
        """The initializer [kernel, channels] of an nn.Conv1d weight `name` stored
        [channels, 1, kernel]; `read` gets a checkpoint tensor as float32."""
        return self.g.weight(name + ".taps", (kernel, channels), self.dtype,
                             lambda: read(name)[:, 0, :].T.astype(self.dtype))

    def _index(self, width: int, channels: int) -> str:
        """[B, width, channels]: where each row's new state starts in `full` and runs on."""
        if (width, channels) not in self._indices:
            g = self.g
            index = g.op("Add", [self.valid, g.const([list(range(width))])])  # [B, width]
            self._indices[width, channels] = g.op(
                "Expand", [g.op("Unsqueeze", [index, g.const([2])]), g.const([1, 1, channels])])
        return self._indices[width, channels]
