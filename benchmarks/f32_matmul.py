"""float32 projections alone: ONNX Runtime's MatMul (MLAS) against edgeprefill.MatMulF32.

    python -m edgeprefill.kernels.build
    python benchmarks/f32_matmul.py --threads 1,2 --rows 1,4,256

For each shape (the SmolLM2-135M projections: 576 -> 1536, 1536 -> 576, 576 -> 576, and the
576 -> 49152 LM head), a graph of `--layers` such nodes on their own random weights (more
bytes than the last-level cache, as a decode step's) runs `--rows` rows of activations:
MatMul on the [K, N] initializer (MLAS packs it at load), and MatMulF32 on the same weight
in panels as engines/ort/f32_projections.py packs it. The two take turns `--turns` times
(op_ab.py).
Prints microseconds per node, new / old, the weight bytes a second each streams, and the
largest difference between the outputs relative to their magnitude (rounding only).
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import helper, numpy_helper
from op_ab import compare_ops, graph_session

from edgeprefill.engines.ort.f32_projections import OP, pack
from edgeprefill.kernels.graph import DOMAIN

OLD = "MatMul"


def session(op: str, k: int, n: int, layers: int, threads: int, library: str):
    rng = np.random.default_rng(k * n)
    nodes, inits = [], []
    for i in range(layers):
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        if op == OP:
            nodes.append(helper.make_node(OP, ["a", f"b{i}"], [f"y{i}"], domain=DOMAIN, N=n))
            inits.append(numpy_helper.from_array(pack(w), f"b{i}"))
        else:
            nodes.append(helper.make_node(OLD, ["a", f"b{i}"], [f"y{i}"]))
            inits.append(numpy_helper.from_array(w, f"b{i}"))
    return graph_session(nodes, inits, threads, library)


def main() -> int:
    return compare_ops(__doc__.splitlines()[0], OLD, OP, session, bytes_per_weight=4.0,
                       rows="1,2,4,256", layers=16)


if __name__ == "__main__":
    sys.exit(main())
