"""The state layers' recurrent states in device memory, for the GPU providers.

The same buffers as `StateArena` (state_arena.py: one per state, `[slots, ...]`, shaped and
typed as its graph input past the batch axis, a scratch buffer beside each), but as
OrtValues on the device, as the KV arena is (arena.py). A step binds the slot rows as the
past input and the scratch rows as the present output, then one device copy moves the
scratch rows into the slots (`store`).

Why not host memory, as on the CPU: ONNX Runtime copies a host input to the device when it
is bound, not when the step runs, so a cached binding kept feeding a step the states it was
bound with (every stateful bundle went wrong from its second step on an H100); and rebound,
the states crossed the bus twice a step (Qwen3.5-0.8B: 19 MB a row each way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import helper

from edgeprefill.engines.ort.state_arena import StatePairs

Place = tuple[str, int]  # (device, address)


class DeviceStates:
    def __init__(
        self, ort: ModuleType, pairs: StatePairs, inputs: Mapping[str, Any], slots: int,
        providers: list[str], device: str = "cuda", device_id: int = 0,
    ) -> None:
        self.pairs = list(pairs)
        self.device, self.device_id = device, device_id
        # per state: its dtype and one row's shape (the graph input past the batch axis)
        self.kinds = [(np.dtype(inputs[past][0]), tuple(int(d) for d in inputs[past][1][1:]))
                      for past, _ in self.pairs]
        self.values = [self._zeroed(ort, slots, kind) for kind in self.kinds]
        self.scratch = [self._zeroed(ort, slots, kind) for kind in self.kinds]
        self._copier = RowCopier(ort, self.kinds, providers)
        self._stores: dict[tuple[int, int], Any] = {}  # bound copy per (first, rows)

    def _zeroed(self, ort: ModuleType, slots: int, kind: tuple[np.dtype, tuple[int, ...]]
                ) -> Any:
        dtype, row = kind
        value = ort.OrtValue.ortvalue_from_shape_and_type((slots, *row), dtype, self.device,
                                                          self.device_id)
        value.update_inplace(np.zeros((slots, *row), dtype))
        return value

    def _row(self, buffers: list[Any], index: int, row: int) -> Place:
        dtype, shape = self.kinds[index]
        row_bytes = int(np.prod(shape)) * dtype.itemsize
        return self.device, buffers[index].data_ptr() + row * row_bytes

    def _rows(self, buffers: list[Any], row: int) -> list[Place]:
        return [self._row(buffers, index, row) for index in range(len(self.kinds))]

    def bind(self, binding: Any, first: int, rows: int) -> None:
        """Bind each past input to slot rows [first, first + rows) and its present output to
        the scratch rows [0, rows), both on the device."""
        for index, (past, present) in enumerate(self.pairs):
            dtype, shape = self.kinds[index]
            _, source = self._row(self.values, index, first)
            _, target = self._row(self.scratch, index, 0)
            binding.bind_input(past, self.device, self.device_id, dtype, (rows, *shape), source)
            binding.bind_output(present, self.device, self.device_id, dtype, (rows, *shape),
                                target)

    def store(self, first: int, rows: int) -> None:
        """After a step: its rows' new states into their slots, on the device."""
        key = (first, rows)
        if key not in self._stores:
            self._stores[key] = self._copier.bind(
                self._rows(self.scratch, 0), self._rows(self.values, first), rows,
                self.device_id)
        self._copier.run(self._stores[key])

    def copy(self, src: int, dst: int) -> None:
        self._copy(self._rows(self.values, src), self._rows(self.values, dst))

    def swap(self, a: int, b: int) -> None:
        held = self._rows(self.scratch, 0)  # free between steps
        self._copy(self._rows(self.values, a), held)
        self._copy(self._rows(self.values, b), self._rows(self.values, a))
        self._copy(held, self._rows(self.values, b))

    def save(self, slot: int) -> list[np.ndarray]:
        """A host copy of one slot's states (a snapshot: kv_cache.py keeps it by position)."""
        saved = [np.empty(shape, dtype) for dtype, shape in self.kinds]
        self._copy(self._rows(self.values, slot),
                   [("cpu", row.ctypes.data) for row in saved])
        return saved

    def restore(self, saved: list[np.ndarray], slot: int) -> None:
        rows = [np.ascontiguousarray(row, dtype) for row, (dtype, _) in
                zip(saved, self.kinds, strict=True)]
        self._copy([("cpu", row.ctypes.data) for row in rows], self._rows(self.values, slot))

    def _copy(self, src: list[Place], dst: list[Place]) -> None:
        self._copier.run(self._copier.bind(src, dst, 1, self.device_id))


class RowCopier:
    """Copies rows of every state at once: one Identity per state, `rows` a free axis, its
    inputs and outputs bound where the rows are (device or host memory)."""

    def __init__(self, ort: ModuleType, kinds: Sequence[tuple[np.dtype, tuple[int, ...]]],
                 providers: list[str]) -> None:
        self.kinds = list(kinds)
        options = ort.SessionOptions()
        # Unoptimized: an input-to-output Identity must stay a real copy into the bound output.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        plain = [p for p in providers if p != "TensorrtExecutionProvider"]
        self.session = ort.InferenceSession(_copies_model(self.kinds).SerializeToString(),
                                            options, providers=plain)

    def bind(self, src: list[Place], dst: list[Place], rows: int, device_id: int) -> Any:
        binding = self.session.io_binding()
        for index, (dtype, shape) in enumerate(self.kinds):
            full = (rows, *shape)
            for name, bind, (device, address) in ((f"src{index}", binding.bind_input,
                                                   src[index]),
                                                  (f"dst{index}", binding.bind_output,
                                                   dst[index])):
                bind(name, device, 0 if device == "cpu" else device_id, dtype, full, address)
        return binding

    def run(self, binding: Any) -> None:
        self.session.run_with_iobinding(binding)


def _copies_model(kinds: Sequence[tuple[np.dtype, tuple[int, ...]]]) -> onnx.ModelProto:
    nodes, inputs, outputs = [], [], []
    for index, (dtype, shape) in enumerate(kinds):
        kind = helper.np_dtype_to_tensor_dtype(dtype)
        nodes.append(helper.make_node("Identity", [f"src{index}"], [f"dst{index}"]))
        inputs.append(helper.make_tensor_value_info(f"src{index}", kind, ["rows", *shape]))
        outputs.append(helper.make_tensor_value_info(f"dst{index}", kind, ["rows", *shape]))
    graph = helper.make_graph(nodes, "edgeprefill_state_copy", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # onnxruntime 1.22+ loads IR <= 10 for this opset
    return model
