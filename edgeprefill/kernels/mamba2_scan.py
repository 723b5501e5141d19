"""Switches the native Mamba2Scan into a chunk graph, in memory: each Mamba-2 mixer's SSM
recurrence, the `Scan` export/mamba2.py writes (its body from Mamba2._step_body: one
token's update of the float32 state h and its output y = h C), becomes one
`edgeprefill.Mamba2Scan` node on the same five inputs and two outputs
(edgeprefill/kernels/mamba2_scan.cc).

The Scan runs its body's 9 nodes once per token, each over every head's h; the op keeps
one (row, head)'s h in cache across the chunk's tokens, the pieces on ONNX Runtime's pool.
The same arithmetic in the same order: h to the bit, y up to float rounding (its sum over
the state size: tests/test_mamba2_kernel.py). Only a Scan with exactly that body (its
inputs, outputs and ops, as the exporter writes them) is switched (scan_body.py).
"""

from __future__ import annotations

import re
from collections import Counter

from onnx import ModelProto, NodeProto

from edgeprefill.kernels.scan_body import ScanBody, count, fuse, matches

OP = "Mamba2Scan"
# Mamba2._step_body(f"mamba{layer}_"): its name, its inputs and outputs in order (after
# the prefix) and the ops of one token's update.
BODY = ScanBody(OP, re.compile(r"mamba\d+_step"), ("h", "dtx", "B", "C", "decay"),
                ("h_out", "y"), Counter({"Unsqueeze": 4, "Mul": 2, "Add": 1, "MatMul": 1,
                                         "Squeeze": 1}))


def fuse_mamba2(model: ModelProto) -> int:
    """Rewrites `model`'s top-level graph in place; returns how many Scans now run OP."""
    return fuse(model, BODY)


def mamba2_scans(model: ModelProto) -> int:
    """How many Scans of `model`'s graph the rewrite would switch (what `inspect` says)."""
    return count(model, BODY)


def is_mamba2_scan(node: NodeProto) -> bool:
    """A Scan over the chunk's axis 1 (four scanned inputs, one scanned output, forward)
    whose body is the exporter's Mamba-2 step (either form)."""
    return matches(node, BODY)
