"""The per-row masks a recurrence over a chunk reads (Qwen3.5's Gated DeltaNet, Mamba-2):
whether a row continues a sequence (else its recurrent state reads as zeros, so a reused
slot never leaks its last one), and which of its tokens are valid (padding leaves the
state as it is)."""

from __future__ import annotations

import numpy as np

from edgeprefill.export.graph import GraphBuilder


def continues(g: GraphBuilder, past_lens: str) -> str:
    """[B, 1, 1, 1] bool: the row's past length is not 0."""
    return g.op("Unsqueeze", [g.op("Greater", [past_lens, g.const(0, np.int32)]),
                              g.const([1, 2, 3])])


def valid_tokens(g: GraphBuilder, valid_lens: str, chunk: str) -> str:
    """[B, C, 1] bool: token t of the row is one of its valid_lens first."""
    column = g.op("Range", [g.const(0, np.int32), g.op("Cast", [
        g.op("Squeeze", [chunk, g.const([0])])], to=6), g.const(1, np.int32)])  # [C]
    return g.op("Unsqueeze", [g.op("Less", [
        g.op("Unsqueeze", [column, g.const([0])]),
        g.op("Unsqueeze", [valid_lens, g.const([1])])]), g.const([2])])
