"""Bytes of weights an ONNX decoder reads per decoded token (for the decode floor of
quantized runtimes). Needs only `onnx` and numpy, present in every runner's venv."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx

# Ops that read one row of a table per token, so their tables do not count as bytes read.
GATHER_OPS = {"Gather", "GatherBlockQuantized"}
FOUR_BIT_TYPES = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
# Rotary tables: a step reads one row of them (ORT GenAI's and edgeprefill's names).
ROTARY_NAMES = ("cos_cache", "sin_cache", "rotary.cos", "rotary.sin")


def tensor_bytes(tensor: onnx.TensorProto) -> float:
    bits = (
        4
        if tensor.data_type in FOUR_BIT_TYPES
        else 8 * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    )
    return math.prod(tensor.dims) * bits / 8


def weight_bytes_per_token(model_path: Path) -> float:
    """Bytes of initializers a decode step reads: everything except gather tables (token
    embedding) and the rotary cos/sin tables, of which a step reads one row."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    total = 0.0
    for tensor in graph.initializer:
        ops = consumers.get(tensor.name, set())
        if ops and ops <= GATHER_OPS:
            continue
        if any(part in tensor.name for part in ROTARY_NAMES):
            continue
        total += tensor_bytes(tensor)
    return total
