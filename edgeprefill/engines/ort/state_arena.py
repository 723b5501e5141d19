"""The conv layers' recurrent state (LFM2): one host buffer per conv layer, slot first.

Each conv layer's state is `[slots, hidden, conv_state]`: the last `conv_state` inputs of
its convolution for the tokens in the slot. A step binds rows [first, first + rows) as
the `past_conv.{i}` input and a scratch buffer of its own as the `present_conv.{i}`
output, then copies the scratch back into those rows (`store`): not in place like the KV,
since the graph reads the old state while it computes the new one, and a few KB per row
cost nothing to copy. The buffers stay in host memory on every provider: ONNX Runtime
copies a bound host input to the device and a bound host output back (the GPU providers'
path is untested: no test machine had a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

StatePairs = Sequence[tuple[str, str]]  # (past input, present output) per conv layer


class StateArena:
    def __init__(self, pairs: StatePairs, shape: tuple[int, int, int], dtype: np.dtype) -> None:
        """`shape`: [slots, hidden, conv_state]."""
        self.pairs = list(pairs)
        self.arrays = [np.zeros(shape, dtype) for _ in self.pairs]
        self.scratch = [np.zeros(shape, dtype) for _ in self.pairs]

    def bind(self, binding: Any, first: int, rows: int) -> None:
        """Bind each past input to rows [first, first + rows) and its present output to
        the scratch rows [0, rows)."""
        for (past, present), state, out in zip(self.pairs, self.arrays, self.scratch,
                                               strict=True):
            view, new = state[first : first + rows], out[:rows]
            binding.bind_input(past, "cpu", 0, state.dtype, view.shape, view.ctypes.data)
            binding.bind_output(present, "cpu", 0, out.dtype, new.shape, new.ctypes.data)

    def store(self, first: int, rows: int) -> None:
        """After a step: its rows' new states into their slots."""
        for state, out in zip(self.arrays, self.scratch, strict=True):
            state[first : first + rows] = out[:rows]

    def copy(self, src: int, dst: int) -> None:
        for state in self.arrays:
            state[dst] = state[src]

    def swap(self, a: int, b: int) -> None:
        for state in self.arrays:
            state[[a, b]] = state[[b, a]]
