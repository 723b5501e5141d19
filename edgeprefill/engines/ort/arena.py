"""The KV arena of the ONNX Runtime backend: one interface, a host and a device memory.

Both hold one buffer per layer and per K/V (layer-major: K0, V0, K1, V1, ...; a layer
whose value is its key, contract.kv_buffers, one buffer bound as both), slot-first
`[slots, KV, cap, D]` (each its layer's KV and D: Gemma 4's layers differ), so the rows of
a step are the contiguous bytes from `address + first_slot * slot_bytes`: each past input
and its present output are bound there and the step updates the cache in place. The
backend holds one `KVArena` and never asks where it lives.

- `HostArena`: numpy arrays (the CPU provider).
- `DeviceArena`: OrtValues in device memory (the CUDA and TensorRT providers). Slot copies
  (prefix reuse, keeping decode rows adjacent) run on the device through `RowCopier`, an
  Identity graph with its input and output bound to the two slots (the device states'
  copies, device_states.py, use it too). They copy the whole slot rather than its first
  `length` positions: a prefix is not contiguous, and the positions past it are masked
  until the slot's owner overwrites them.
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
        self.values = [device_zeros(ort, zeros[shape], device, device_id)
                       for shape in self.shapes]
        largest = max(self.shapes, key=lambda shape: int(np.prod(shape[1:])), default=None)
        self._spare = None if largest is None else device_zeros(ort, zeros[largest][:1],
                                                                  device, device_id)
        self._copiers = {shape[1:]: RowCopier(ort, [(self.dtype, shape[1:])], providers)
                         for shape in zeros}

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
            self._copy(index, self.slot_address(index, src), self.slot_address(index, dst))

    def swap(self, a: int, b: int, length: int | None = None) -> None:
        if self._spare is None:  # no buffer to swap
            return
        spare = self._spare.data_ptr()
        for index in range(len(self.values)):
            self._copy(index, self.slot_address(index, a), spare)
            self._copy(index, self.slot_address(index, b), self.slot_address(index, a))
            self._copy(index, spare, self.slot_address(index, b))

    def _copy(self, index: int, src: int, dst: int) -> None:
        """One slot of buffer `index` from address `src` to `dst`, on the device."""
        copier = self._copiers[self.shapes[index][1:]]
        copier.run(copier.bind([(self.device, src)], [(self.device, dst)], 1, self.device_id))

    def host_arrays(self) -> list[np.ndarray]:
        return [value.numpy() for value in self.values]


Place = tuple[str, int]  # (device, address) of rows: device or host ("cpu") memory


def device_zeros(ort: ModuleType, zeros: np.ndarray, device: str, device_id: int) -> Any:
    """An OrtValue on the device holding `zeros` (its shape and dtype)."""
    value = ort.OrtValue.ortvalue_from_shape_and_type(zeros.shape, zeros.dtype, device,
                                                      device_id)
    value.update_inplace(zeros)
    return value


class RowCopier:
    """Copies rows of several buffers at once (the KV arena's slots, the device states'):
    one Identity per buffer kind, `rows` a free axis, its inputs and outputs bound where the
    rows are (device or host memory)."""

    def __init__(self, ort: ModuleType, kinds: Sequence[tuple[np.dtype, tuple[int, ...]]],
                 providers: list[str]) -> None:
        self.kinds = list(kinds)
        options = ort.SessionOptions()
        # Unoptimized: an input-to-output Identity must stay a real copy into the bound output.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        # The TensorRT EP would compile an engine for one Identity: copy with CUDA or CPU.
        plain = [p for p in providers if p != "TensorrtExecutionProvider"]
        self.session = ort.InferenceSession(_copies_model(self.kinds).SerializeToString(),
                                            options, providers=plain)

    def bind(self, src: list[Place], dst: list[Place], rows: int, device_id: int) -> Any:
        """A binding that copies `rows` rows of each kind from `src` to `dst`."""
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
        kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        nodes.append(helper.make_node("Identity", [f"src{index}"], [f"dst{index}"]))
        inputs.append(helper.make_tensor_value_info(f"src{index}", kind, ["rows", *shape]))
        outputs.append(helper.make_tensor_value_info(f"dst{index}", kind, ["rows", *shape]))
    graph = helper.make_graph(nodes, "edgeprefill_row_copy", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # onnxruntime 1.22+ loads IR <= 10 for this opset
    return model
