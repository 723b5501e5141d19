"""int8 projections alone: ONNX Runtime's DynamicQuantizeMatMul against edgeprefill.MatMulInt8.

    python -m edgeprefill.kernels.build
    python benchmarks/int8_matmul.py --threads 1,2 --rows 1,16,64,256

For each shape (the SmolLM2-135M projections: 576 -> 1536, 1536 -> 576, 576 -> 576, and the
576 -> 49152 LM head), a graph of `--layers` such nodes on their own random per-column int8
weights (as `export --quantize int8` writes them) runs `--rows` rows of activations:
DynamicQuantizeMatMul as an int8 bundle's session runs it here (on uint8 weights at a zero
point of 128 where this CPU's int8 GEMM would saturate: engines/ort/int8_unsigned.py), and
MatMulInt8 on the same codes packed as engines/ort/int8_rows.py packs them. The two take
turns `--turns` times (op_ab.py). Prints microseconds per node (median), the weight bytes
streamed a second, new / old, and the largest difference between the outputs relative to
their magnitude (DynamicQuantizeMatMul scales a call's rows together, MatMulInt8 each row
on its own: not the same numbers).
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import helper, numpy_helper
from op_ab import compare_ops, graph_session

from edgeprefill.engines.ort import int8_unsigned
from edgeprefill.engines.ort.int8_rows import OP, pack
from edgeprefill.export.quantize import int8_per_channel
from edgeprefill.kernels.graph import DOMAIN

OLD = "DynamicQuantizeMatMul"


def session(op: str, k: int, n: int, layers: int, threads: int, library: str):
    rng = np.random.default_rng(k * n)
    nodes, inits = [], []
    for i in range(layers):
        codes, scales = int8_per_channel(rng.standard_normal((k, n)).astype(np.float32))
        names = [f"b{i}", f"s{i}"]
        if op == OP:
            packed, sums = pack(codes)
            nodes.append(helper.make_node(OP, ["a", f"b{i}", f"s{i}", f"c{i}"], [f"y{i}"],
                                          domain=DOMAIN, N=n))
            inits += [numpy_helper.from_array(packed, f"b{i}"),
                      numpy_helper.from_array(sums, f"c{i}")]
        elif int8_unsigned.saturates():
            nodes.append(helper.make_node(OLD, ["a", *names, f"z{i}"], [f"y{i}"],
                                          domain="com.microsoft"))
            inits += [numpy_helper.from_array(int8_unsigned.unsigned(codes), f"b{i}"),
                      numpy_helper.from_array(int8_unsigned.zero_points(n), f"z{i}")]
        else:
            nodes.append(helper.make_node(OLD, ["a", *names], [f"y{i}"], domain="com.microsoft"))
            inits.append(numpy_helper.from_array(codes, f"b{i}"))
        inits.append(numpy_helper.from_array(scales.astype(np.float32), f"s{i}"))
    return graph_session(nodes, inits, threads, library)


def main() -> int:
    return compare_ops(__doc__.splitlines()[0], OLD, OP, session, bytes_per_weight=1.0,
                       rows="1,16,64,256", layers=8)


if __name__ == "__main__":
    sys.exit(main())
