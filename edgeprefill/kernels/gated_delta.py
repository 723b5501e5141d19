"""Switches the native GatedDeltaRule into a chunk graph, in memory: each Gated DeltaNet
layer's recurrence, the `Scan` export/gated_delta.py writes (its body from
GatedDeltaNet._step_body: one token's update of the float32 state S and its output),
becomes one `edgeprefill.GatedDeltaRule` node on the same six inputs and two outputs
(edgeprefill/kernels/gated_delta.cc).

The Scan runs its body's ~14 nodes once per token, each over every head's S; the op keeps
one (row, head)'s S in cache across the chunk's tokens, the pieces on ONNX Runtime's pool.
The same arithmetic in the same order, so the same values up to float rounding (the sums
over the key dimension: tests/test_gated_delta_kernel.py). Only a Scan with exactly that
body (its inputs, outputs and ops, as the exporter writes them) is switched (scan_body.py).
"""

from __future__ import annotations

import re
from collections import Counter

from onnx import ModelProto, NodeProto

from edgeprefill.kernels.scan_body import ScanBody, count, fuse, matches

OP = "GatedDeltaRule"
# GatedDeltaNet._step_body(f"delta{layer}_"): its name, its inputs and outputs in order
# (after the prefix) and the ops of one token's update.
BODY = ScanBody(OP, re.compile(r"delta\d+_step"), ("S", "q", "k", "v", "decay", "beta"),
                ("S_out", "o"), Counter({"Unsqueeze": 6, "Mul": 3, "MatMul": 2, "Sub": 1,
                                         "Add": 1, "Squeeze": 1}))


def fuse_gated_delta(model: ModelProto) -> int:
    """Rewrites `model`'s top-level graph in place; returns how many Scans now run OP."""
    return fuse(model, BODY)


def delta_scans(model: ModelProto) -> int:
    """How many Scans of `model`'s graph the rewrite would switch (what `inspect` says)."""
    return count(model, BODY)


def is_delta_scan(node: NodeProto) -> bool:
    """A Scan over the chunk's axis 1 (five scanned inputs, one scanned output, forward)
    whose body is the exporter's DeltaNet step."""
    return matches(node, BODY)
