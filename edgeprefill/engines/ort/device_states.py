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

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from edgeprefill.engines.ort.arena import Place, RowCopier, device_zeros
from edgeprefill.engines.ort.state_arena import StatePairs


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
        self.values = [self._zeros(ort, slots, kind) for kind in self.kinds]
        self.scratch = [self._zeros(ort, slots, kind) for kind in self.kinds]
        self._copier = RowCopier(ort, self.kinds, providers)
        self._stores: dict[tuple[int, int], Any] = {}  # bound copy per (first, rows)

    def _zeros(self, ort: ModuleType, slots: int,
               kind: tuple[np.dtype, tuple[int, ...]]) -> Any:
        dtype, row = kind
        return device_zeros(ort, np.zeros((slots, *row), dtype), self.device, self.device_id)

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
