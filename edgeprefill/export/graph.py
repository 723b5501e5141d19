"""A small ONNX graph builder: nodes, graph I/O, inline constants and lazily read weights.

Weights are registered with their shape and a function that produces them, so the writer
can stream them to the external data file one at a time with progress, and the graph is
assembled without ever holding every weight in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ONNX_DTYPE = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
}


@dataclass(frozen=True)
class Weight:
    """An initializer written to external data: its shape, dtype and how to read it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


@dataclass(frozen=True)
class ValueInfo:
    name: str
    dtype: np.dtype
    shape: tuple[int | str, ...]  # str: a symbolic dimension

    def proto(self) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(self.name, ONNX_DTYPE[self.dtype], list(self.shape))


class GraphBuilder:
    def __init__(self, prefix: str = "") -> None:
        """`prefix` starts every name this builder makes: a subgraph's (a loop body's)
        must not shadow its outer graph's."""
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[ValueInfo] = []
        self.outputs: list[ValueInfo] = []
        self.weights: list[Weight] = []
        self.constants: list[TensorProto] = []
        self._const_cache: dict[tuple, str] = {}
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        **attrs,
    ) -> str | list[str]:
        """Add one node; returns its output name, or the list of names when several."""
        if isinstance(outputs, int):
            names = [self._name(op_type) for _ in range(outputs)]
        else:
            names = list(outputs)
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), names, name=self._name(op_type + "_node"),
                domain=domain, **attrs,
            )
        )
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype=np.int64) -> str:
        """A small constant stored inside the graph (shapes, axes, scalars), deduplicated."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._const_cache:
            name = self._name("const")
            self.constants.append(numpy_helper.from_array(array, name))
            self._const_cache[key] = name
        return self._const_cache[key]

    def weight(
        self, name: str, shape: Sequence[int], dtype: np.dtype, produce: Callable[[], np.ndarray]
    ) -> str:
        """A large initializer written once to the external data file."""
        self.weights.append(Weight(name, tuple(int(d) for d in shape), np.dtype(dtype), produce))
        return name

    def input(self, name: str, dtype, shape: Sequence[int | str]) -> str:
        self.inputs.append(ValueInfo(name, np.dtype(dtype), tuple(shape)))
        return name

    def output(self, name: str, dtype, shape: Sequence[int | str]) -> str:
        self.outputs.append(ValueInfo(name, np.dtype(dtype), tuple(shape)))
        return name

    def rename(self, value: str, new_name: str) -> str:
        """Expose an intermediate value under a graph output name (an Identity costs nothing
        after ORT's optimizer removes it, and keeps node outputs free of I/O naming)."""
        return self.op("Identity", [value], [new_name])

    def to_graph(self, name: str) -> onnx.GraphProto:
        """This builder as a subgraph (an op's body attribute), its constants inside; it
        holds no external weights."""
        return helper.make_graph(self.nodes, name, [i.proto() for i in self.inputs],
                                 [o.proto() for o in self.outputs], initializer=self.constants)

    def to_model(
        self, initializers: list[TensorProto], opsets: dict[str, int], ir_version: int
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "edgeprefill_chunk_graph",
            [i.proto() for i in self.inputs],
            [o.proto() for o in self.outputs],
            initializer=self.constants + initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
            producer_name="edgeprefill",
        )
        model.ir_version = ir_version
        return model
