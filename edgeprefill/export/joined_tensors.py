"""Tensors transformers concatenates as it loads a checkpoint, read as one.

Molmo 2's Hub checkpoints store the token embedding as two tables, the base vocabulary's
(`wte.embedding`) and the extra tokens' (`wte.new_embedding`); transformers' conversion
mapping concatenates them along the rows into `embed_tokens.weight` (and saves them back
as two halves of equal size: any split of the rows reads the same). `Joined` gives such a
name's shape and values from its stored parts; the parts count as read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from edgeprefill.errors import ExportError


class Joined:
    """The joined names of one checkpoint: a name read -> its stored parts, in row order.
    A pair whose name is stored itself, or whose parts are not all stored, is not one."""

    def __init__(self, pairs: Iterable[tuple[str, tuple[str, ...]]],
                 stored: Callable[[str], bool]) -> None:
        self.parts = {name: parts for name, parts in pairs
                      if not stored(name) and all(stored(part) for part in parts)}

    def __contains__(self, name: str) -> bool:
        return name in self.parts

    def shape(self, name: str, shape_of: Callable[[str], tuple[int, ...]]) -> tuple[int, ...]:
        """The rows of all parts, of the parts' common other dimensions."""
        shapes = [shape_of(part) for part in self.parts[name]]
        if len({shape[1:] for shape in shapes}) != 1 or not all(shapes):
            listed = ", ".join(f"{p} {s}" for p, s in zip(self.parts[name], shapes, strict=True))
            raise ExportError(f"{name} joins tensors of other widths: {listed}")
        return (sum(shape[0] for shape in shapes), *shapes[0][1:])

    def values(self, name: str, read: Callable[[str], np.ndarray]) -> np.ndarray:
        """The parts' values (as float32) one after another along the rows."""
        return np.concatenate([read(part).astype(np.float32, copy=False)
                               for part in self.parts[name]])
