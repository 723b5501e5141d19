"""Where a step's tokens live between the graph's [B, C] inputs and its layers.

A call is B rows of C tokens, row r's first `valid_lens[r]` valid and the rest padding.
`PaddedTokens` runs every token, padding included: the stream is [B, C, hidden]. With
`PackedTokens` the projections, norms and MLP run on the valid tokens only, packed row
after row into [1, T, hidden] (T = the sum of valid_lens), and attention, which needs each
row's tokens at their positions, gets them spread back to [B, C, ...] and gathers its
output packed again. So a call whose rows differ in length (a 64-token prefill chunk beside
three decode rows padded to 64) costs what its T tokens cost, which lets the runtime run
a prefill chunk and the decode rows in one call and read the weights once per step.

Spreading fills a row's padding with copies of its last valid token: attention computes
them and writes their keys and values past the row's valid ones, as for any padding, and
nothing reads them (the next call overwrites them).
"""

from __future__ import annotations

import numpy as np

from edgeprefill.export.graph import GraphBuilder


class PaddedTokens:
    """Every token of [B, C], padding included (what the `standard` flavour's static
    shapes want)."""

    def __init__(self, g: GraphBuilder, valid_lens: str) -> None:
        self.g = g
        self.valid_lens = valid_lens

    def embed(self, table: str, ids: str) -> str:
        return self.g.op("Gather", [table, self.indices(ids)])  # [B, C, hidden]

    def indices(self, ids: str) -> str:
        """The ids [B, C] as a table's Gather takes them (every token's)."""
        return ids

    def spread(self, x: str) -> str:
        return x

    def gather(self, x: str, width: int) -> str:
        return x

    def last(self, x: str) -> str:
        """[B, hidden]: each row's last valid token."""
        g = self.g
        last = g.op("Sub", [self.valid_lens, g.const([1], np.int32)])
        index = g.op("Unsqueeze", [g.op("Cast", [last], to=7), g.const([1])])  # [B, 1]
        return g.op("GatherND", [x, index], batch_dims=1)


class PackedTokens:
    """Only the valid tokens, packed into [1, T, ...] (see the module docstring)."""

    def __init__(self, g: GraphBuilder, valid_lens: str, chunk: str) -> None:
        self.g = g
        valid = g.op("Cast", [valid_lens], to=7)  # [B] int64
        positions = g.op("Range", [g.const(0, np.int64),
                                   g.op("Squeeze", [chunk, g.const([0])]),
                                   g.const(1, np.int64)])  # [C]
        row_valid = g.op("Unsqueeze", [valid, g.const([1])])  # [B, 1]
        column = g.op("Unsqueeze", [positions, g.const([0])])  # [1, C]
        mask = g.op("Less", [column, row_valid])  # [B, C]: valid tokens
        flat = g.op("NonZero", [g.op("Reshape", [mask, g.const([-1])])])  # [1, T]
        self.index = g.op("Squeeze", [flat, g.const([0])])  # [T]: b * C + c per valid token
        ends = g.op("CumSum", [valid, g.const(0, np.int64)])  # [B]: past each row's tokens
        starts = g.op("Sub", [ends, valid])
        clamped = g.op("Min", [column, g.op("Sub", [row_valid, g.const(1, np.int64)])])
        # [B, C]: the packed index of each position, padding -> the row's last valid token
        self.spread_index = g.op("Add", [g.op("Unsqueeze", [starts, g.const([1])]), clamped])
        self.last_index = g.op("Unsqueeze", [g.op("Sub", [ends, g.const(1, np.int64)]),
                                             g.const([1])])  # [B, 1]

    def embed(self, table: str, ids: str) -> str:
        return self.g.op("Gather", [table, self.indices(ids)])  # [1, T, hidden]

    def indices(self, ids: str) -> str:
        """The valid tokens' ids, packed [1, T], as a table's Gather takes them."""
        g = self.g
        valid_ids = g.op("Gather", [g.op("Reshape", [ids, g.const([-1])]), self.index])
        return g.op("Unsqueeze", [valid_ids, g.const([0])])

    def spread(self, x: str) -> str:
        """[1, T, w] -> [B, C, w]."""
        g = self.g
        return g.op("Squeeze", [g.op("Gather", [x, self.spread_index], axis=1), g.const([0])])

    def gather(self, x: str, width: int) -> str:
        """[B, C, width] -> [1, T, width]."""
        g = self.g
        flat = g.op("Reshape", [x, g.const([1, -1, width])])
        return g.op("Gather", [flat, self.index], axis=1)

    def last(self, x: str) -> str:
        """[B, hidden]: each row's last valid token (a GatherND, which the int4 rewrites
        take for the start of the per-sequence rows)."""
        g = self.g
        return g.op("GatherND", [g.op("Squeeze", [x, g.const([0])]), self.last_index])
