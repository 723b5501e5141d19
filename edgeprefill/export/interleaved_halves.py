"""Tensors transformers de-interleaves and cuts in two as it loads a checkpoint, read as
their halves.

Inkling's image-text checkpoints (`inkling_mm_model`) store an MLP's gate and up rows as one
tensor, interleaved along an axis (g0, u0, g1, u1, ...): a dense MLP's `mlp.w13_dn.weight`
[2I, H] along its rows, the shared experts' `shared_w13_weight` [S, 2I, H] along axis 1.
transformers' conversion mapping de-interleaves it (`Interleave`) and cuts it in two
(`Chunk`) into `gate_proj` and `up_proj`: the gate is the even rows, the up the odd ones.
`Halves` gives each half's name its shape and values from the stored tensor, which counts
as read. (The routed experts' `w13_weight` is de-interleaved only, into one fused
gate_up_proj: `MoeNames.interleaved` reads it, as gpt-oss's.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from edgeprefill.errors import ExportError

# (the stored name's suffix, as read after the renames; the two halves' suffixes in order;
# the axis they interleave along)
HalvesRule = tuple[str, tuple[str, str], int]


class Halves:
    """The halves of one checkpoint: a name read -> (the stored tensor's name, the axis,
    0 for the even rows or 1 for the odd)."""

    def __init__(self, rules: Iterable[HalvesRule], stored: Iterable[str]) -> None:
        self.parts: dict[str, tuple[str, int, int]] = {}
        names = list(stored)
        for suffix, halves, axis in rules:
            for name in names:
                if name.endswith(suffix):
                    stem = name[:-len(suffix)]
                    for which, half in enumerate(halves):
                        self.parts[stem + half] = (name, axis, which)

    def __contains__(self, name: str) -> bool:
        return name in self.parts

    def shape(self, name: str, shape_of: Callable[[str], tuple[int, ...]]) -> tuple[int, ...]:
        """The stored tensor's shape, half as long along the axis."""
        stored, axis, _ = self.parts[name]
        shape = list(shape_of(stored))
        if len(shape) <= axis or shape[axis] % 2:
            raise ExportError(f"{stored} has shape {tuple(shape)}: it interleaves two halves "
                              f"along axis {axis}, which must be of even length")
        shape[axis] //= 2
        return tuple(shape)

    def values(self, name: str, read: Callable[[str], np.ndarray]) -> np.ndarray:
        """Every other row along the axis, from the first (the gate) or the second (up)."""
        stored, axis, which = self.parts[name]
        tensor = read(stored)
        return np.take(tensor, np.arange(which, tensor.shape[axis], 2), axis=axis)
