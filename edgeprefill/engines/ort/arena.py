"""The KV arena in device memory for ONNX Runtime's GPU providers, bound by pointer per slot.

One OrtValue per layer and per K/V, slot-first `[slots, KV, cap, D]` as on the CPU, so the
rows of a step are the contiguous bytes from `data_ptr() + first_slot * slot_bytes`: each
past input and its present output are bound there and the step updates the cache in place.

Slot copies (prefix reuse, keeping decode rows adjacent) run on the device through a
one-node Identity graph with its input and output bound to the two slots. They copy the
whole slot rather than its first `length` positions: a prefix is not contiguous, and the
positions past it are masked until the slot's owner overwrites them.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import onnx
from onnx import helper


class DeviceArena:
    def __init__(
        self, ort: ModuleType, shape: tuple[int, ...], dtype: np.dtype, count: int,
        providers: list[str], device: str = "cuda", device_id: int = 0,
    ) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.device, self.device_id = device, device_id
        # Zero-filled: the standard graph attends over the whole capacity with an additive
        # mask, so never-written positions must hold finite numbers. One host buffer of a
        # single arena is reused for every upload.
        zeros = np.zeros(shape, self.dtype)
        self.values = [self._zeroed(ort, zeros) for _ in range(count)]
        self._spare = self._zeroed(ort, zeros[:1])
        self._copier = SlotCopier(ort, shape[1:], self.dtype, providers, device, device_id)

    def _zeroed(self, ort: ModuleType, zeros: np.ndarray):
        value = ort.OrtValue.ortvalue_from_shape_and_type(
            zeros.shape, self.dtype, self.device, self.device_id
        )
        value.update_inplace(zeros)
        return value

    @property
    def slots(self) -> int:
        return self.shape[0]

    @property
    def slot_bytes(self) -> int:
        return int(np.prod(self.shape[1:])) * self.dtype.itemsize

    def slot_address(self, index: int, slot: int) -> int:
        return self.values[index].data_ptr() + slot * self.slot_bytes

    def bind(self, binding, pairs: list[tuple[str, str]], first: int, rows: int) -> None:
        """Bind each (past, present) pair to rows [first, first + rows) of its arena."""
        shape = (rows, *self.shape[1:])
        for index, (past, present) in enumerate(pairs):
            address = self.slot_address(index, first)
            binding.bind_input(past, self.device, self.device_id, self.dtype, shape, address)
            binding.bind_output(present, self.device, self.device_id, self.dtype, shape, address)

    def copy(self, src: int, dst: int) -> None:
        for index in range(len(self.values)):
            self._copier.copy(self.slot_address(index, src), self.slot_address(index, dst))

    def swap(self, a: int, b: int) -> None:
        spare = self._spare.data_ptr()
        for index in range(len(self.values)):
            self._copier.copy(self.slot_address(index, a), spare)
            self._copier.copy(self.slot_address(index, b), self.slot_address(index, a))
            self._copier.copy(spare, self.slot_address(index, b))

    def host_arrays(self) -> list[np.ndarray]:
        """The arena copied to the host (for inspection and tests)."""
        return [value.numpy() for value in self.values]


class SlotCopier:
    """Copies one slot's bytes to another on the device: Identity(src) -> dst, both bound."""

    def __init__(
        self, ort: ModuleType, slot_shape: tuple[int, ...], dtype: np.dtype,
        providers: list[str], device: str, device_id: int,
    ) -> None:
        self.shape = (1, *slot_shape)
        self.dtype, self.device, self.device_id = dtype, device, device_id
        options = ort.SessionOptions()
        # Unoptimized: an input-to-output Identity must stay a real copy into the bound output.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        # The TensorRT EP would compile an engine for one Identity: copy with CUDA or CPU.
        plain = [p for p in providers if p != "TensorrtExecutionProvider"]
        model = _identity_model(self.shape, dtype)
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=plain)

    def copy(self, src: int, dst: int) -> None:
        binding = self.session.io_binding()
        binding.bind_input("src", self.device, self.device_id, self.dtype, self.shape, src)
        binding.bind_output("dst", self.device, self.device_id, self.dtype, self.shape, dst)
        self.session.run_with_iobinding(binding)


def _identity_model(shape: tuple[int, ...], dtype: np.dtype) -> onnx.ModelProto:
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["src"], ["dst"])], "edgeprefill_slot_copy",
        [helper.make_tensor_value_info("src", kind, list(shape))],
        [helper.make_tensor_value_info("dst", kind, list(shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # onnxruntime 1.22+ loads IR <= 10 for this opset
    return model
