"""The state layers' recurrent states (LFM2, Qwen3.5) on the CPU: one host buffer per state.

Each state is `[slots, ...]`, shaped and typed as its graph input past the batch axis (a
short convolution's last inputs, a Gated DeltaNet's conv inputs and its float32 recurrent
matrix). A step binds rows [first, first + rows) as the `past_*` input and a scratch
buffer of its own as the `present_*` output, then copies the scratch back into those rows
(`store`): not in place like the KV, since the graph reads the old state while it computes
the new one, and a few KB to a few MB per row cost little to copy next to a step. The
buffers are host memory, slot first, for the CPU provider; the GPU providers keep the same
buffers in device memory (device_states.py says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

StatePairs = Sequence[tuple[str, str]]  # (past input, present output) per state


class StateArena:
    def __init__(self, pairs: StatePairs, inputs: Mapping[str, Any], slots: int) -> None:
        """`inputs`: the graph's input table (name -> [dtype, shape]), whose entry for each
        past input gives its state's dtype and per-row shape."""
        self.pairs = list(pairs)
        self.arrays = [_zeros(inputs[past], slots) for past, _ in self.pairs]
        self.scratch = [np.zeros_like(state) for state in self.arrays]

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

    def save(self, slot: int) -> list[np.ndarray]:
        """A copy of one slot's states (a snapshot: kv_cache.py keeps it by position)."""
        return [state[slot].copy() for state in self.arrays]

    def restore(self, saved: list[np.ndarray], slot: int) -> None:
        for state, row in zip(self.arrays, saved, strict=True):
            state[slot] = row


def _zeros(spec: Any, slots: int) -> np.ndarray:
    dtype, shape = spec
    return np.zeros((slots, *(int(d) for d in shape[1:])), np.dtype(dtype))
