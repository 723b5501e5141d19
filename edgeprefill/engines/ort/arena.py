"""The KV arena of the ONNX Runtime backend: one interface, a host and a device memory.

Both hold one buffer per layer and per K/V (layer-major: K0, V0, K1, V1, ...; a layer
whose value is its key, contract.kv_buffers, one buffer bound as both), slot-first
`[slots, KV, cap, D]` (each its layer's KV and D: Gemma 4's layers differ), so the rows of
a step are the contiguous bytes from `address + first_slot * slot_bytes`: each past input
and its present output are bound there and the step updates the cache in place. The
backend holds one `KVArena` and never asks where it lives.

- `HostArena`: numpy arrays (the CPU provider).
- `DeviceArena`: OrtValues in device memory (the CUDA and TensorRT providers). Slot copies
  (prefix reuse, keeping decode rows adjacent) run on the device through a one-node
  Identity graph with its input and output bound to the two slots. They copy the whole
  slot rather than its first `length` positions: a prefix is not contiguous, and the
  positions past it are masked until the slot's owner overwrites them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import helper

# Per buffer, in arena order, the (past input, present output) pairs bound to it: one, or
# a layer's key and value pair where its value is its key (contract.kv_buffers).
KVBuffers = Sequence[Sequence[tuple[str, str]]]


class KVArena(ABC):
    """Slot-first KV buffers bound to a step's IOBinding in place."""

    shapes: list[tuple[int, ...]]  # per buffer [slots, KV, cap, D]
    # Its own count, not shapes[0][0]: a bundle whose every layer carries states instead
    # (Mamba-2) has no buffer, yet its slots hold those states.
    slots: int

    @abstractmethod
    def bind(self, binding: Any, buffers: KVBuffers, first: int, rows: int) -> None:
        """Bind each buffer's (past, present) pairs to rows [first, first + rows) of it."""

    @abstractmethod
    def copy(self, src: int, dst: int, length: int) -> None:
        """Copy at least positions [0, length) of one slot to another."""

    @abstractmethod
    def swap(self, a: int, b: int, length: int) -> None:
        """Exchange at least positions [0, length) of two slots."""

    @abstractmethod
    def host_arrays(self) -> list[np.ndarray]:
        """The buffers as numpy arrays (the live ones on the host, copies from a device)."""


class HostArena(KVArena):
    def __init__(self, shapes: Sequence[tuple[int, ...]], dtype: np.dtype, slots: int) -> None:
        self.shapes, self.slots = list(shapes), slots
        self.arrays = [np.zeros(shape, dtype) for shape in self.shapes]
        # np.zeros maps its pages lazily. Measured on the 2-core VM: the first prefill into
        # each fresh slot took 3-4x as long (a 128-token chunk 274-462 ms against ~95 ms),
        # which made short-prompt TTFT bimodal across processes. Touching every page here
        # moves that cost to load (~0.6 s for 4 slots of 106 MB) and off the first requests.
        for array in self.arrays:
            array.fill(0)

    def bind(self, binding: Any, buffers: KVBuffers, first: int, rows: int) -> None:
        for pairs, arena in zip(buffers, self.arrays, strict=True):
            view = arena[first : first + rows]  # contiguous: slot is the first axis
            for past, present in pairs:
                for name, bind in ((past, binding.bind_input), (present, binding.bind_output)):
                    bind(name, "cpu", 0, arena.dtype, view.shape, view.ctypes.data)

    def copy(self, src: int, dst: int, length: int) -> None:
        for arena in self.arrays:
            arena[dst, :, :length] = arena[src, :, :length]

    def swap(self, a: int, b: int, length: int) -> None:
        for arena in self.arrays:
            held = arena[a, :, :length].copy()
            arena[a, :, :length] = arena[b, :, :length]
            arena[b, :, :length] = held

    def host_arrays(self) -> list[np.ndarray]:
        return self.arrays


class DeviceArena(KVArena):
    def __init__(
        self, ort: ModuleType, shapes: Sequence[tuple[int, ...]], dtype: np.dtype, slots: int,
        providers: list[str], device: str = "cuda", device_id: int = 0,
    ) -> None:
        self.shapes, self.dtype, self.slots = list(shapes), np.dtype(dtype), slots
        self.device, self.device_id = device, device_id
        # Zero-filled: the standard graph attends over the whole capacity with an additive
        # mask, so never-written positions must hold finite numbers. One host buffer per
        # distinct shape is reused for every upload.
        zeros = {shape: np.zeros(shape, self.dtype) for shape in self.shapes}
        self.values = [self._zeroed(ort, zeros[shape]) for shape in self.shapes]
        largest = max(self.shapes, key=lambda shape: int(np.prod(shape[1:])), default=None)
        self._spare = None if largest is None else self._zeroed(ort, zeros[largest][:1])
        self._copiers = {shape[1:]: SlotCopier(ort, shape[1:], self.dtype, providers, device,
                                               device_id) for shape in zeros}

    def _zeroed(self, ort: ModuleType, zeros: np.ndarray) -> Any:
        value = ort.OrtValue.ortvalue_from_shape_and_type(
            zeros.shape, self.dtype, self.device, self.device_id
        )
        value.update_inplace(zeros)
        return value

    def slot_bytes(self, index: int) -> int:
        return int(np.prod(self.shapes[index][1:])) * self.dtype.itemsize

    def slot_address(self, index: int, slot: int) -> int:
        address: int = self.values[index].data_ptr()
        return address + slot * self.slot_bytes(index)

    def bind(self, binding: Any, buffers: KVBuffers, first: int, rows: int) -> None:
        for index, pairs in enumerate(buffers):
            shape = (rows, *self.shapes[index][1:])
            address = self.slot_address(index, first)
            for past, present in pairs:
                binding.bind_input(past, self.device, self.device_id, self.dtype, shape,
                                   address)
                binding.bind_output(present, self.device, self.device_id, self.dtype, shape,
                                    address)

    def copy(self, src: int, dst: int, length: int | None = None) -> None:
        for index in range(len(self.values)):
            self._copier(index).copy(self.slot_address(index, src),
                                     self.slot_address(index, dst))

    def swap(self, a: int, b: int, length: int | None = None) -> None:
        if self._spare is None:  # no buffer to swap
            return
        spare = self._spare.data_ptr()
        for index in range(len(self.values)):
            copier = self._copier(index)
            copier.copy(self.slot_address(index, a), spare)
            copier.copy(self.slot_address(index, b), self.slot_address(index, a))
            copier.copy(spare, self.slot_address(index, b))

    def _copier(self, index: int) -> SlotCopier:
        return self._copiers[self.shapes[index][1:]]

    def host_arrays(self) -> list[np.ndarray]:
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
