"""TensorRT backend: the engine `edgeprefill build` compiled, run with the KV cache in place.

The KV cache is one device arena per layer and per K/V, slot-first `[slots, KV, cap, D]`
like the ONNX Runtime backend's, so the rows of a call are the contiguous bytes from
`arena + first_slot * slot_bytes`; each past input and its present output are bound to that
one address and the engine's KV-cache update layer writes the new tokens there. Small
inputs go through staging buffers allocated once. Which profile, padding, address and shape
each call gets is decided in `trt.steps` (pure, tested on the CPU); this class moves bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeprefill.bundle import Manifest
from edgeprefill.contract import INPUT_IDS, LOGITS, PAST_LENS, VALID_LENS, step_output
from edgeprefill.engines.base import Backend, BackendOptions, StepBatch
from edgeprefill.engines.trt.graph import refuse_state, require_standard
from edgeprefill.engines.trt.plan import aligned_capacity
from edgeprefill.engines.trt.runtime import EngineRuntime, open_runtime
from edgeprefill.engines.trt.steps import (
    Call,
    DeviceBuffers,
    call_bindings,
    plan_calls,
    slot_prefix_copies,
    staging_sizes,
)
from edgeprefill.errors import BackendError, SettingError


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(
        self, bundle_dir: Path, manifest: Manifest, options: BackendOptions,
        runtime: EngineRuntime | None = None,
    ) -> None:
        super().__init__(bundle_dir, manifest, options)
        if options.compute != "fp32":  # before anything loads: the engine fixes its precision
            raise BackendError(f"--compute {options.compute} is for the onnxruntime backend; a "
                               "TensorRT engine's precision is chosen when it is built "
                               "(`edgeprefill build --precision bf16`)")
        require_standard(manifest)
        refuse_state(manifest)
        self.runtime = runtime or open_runtime(bundle_dir, manifest, options)
        self.device = self.runtime.device
        self.plan = self.runtime.plan
        graph = manifest.graph
        self._pairs = list(zip(_flat(graph.kv_inputs), _flat(graph.kv_outputs), strict=True))
        m = manifest.model
        self._kv_shape = (m.num_kv_heads, self.plan.capacity, m.head_dim)
        # logits [rows, vocab], or an embedding bundle's hidden [rows, hidden_size]
        self._output = step_output(manifest)
        self._vocab = self._output.width
        self._arenas: list[int] = []
        self._spare = 0  # one slot of one arena: the middle stop of a swap
        self._slots = 0
        rows, tokens = staging_sizes(self.plan)
        sizes = {INPUT_IDS: tokens * 8, PAST_LENS: rows * 4, VALID_LENS: rows * 4,
                 LOGITS: rows * self._vocab * 4}
        self._stage: dict[str, int] = {}
        try:
            for name, nbytes in sizes.items():
                self._stage[name] = self.device.alloc(nbytes)
        except BackendError:
            self.close()  # what was allocated, the engine and the stream
            raise

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot in one arena (one layer's K or V)."""
        heads, capacity, dim = self._kv_shape
        return heads * capacity * dim * self.kv_dtype.itemsize

    def allocate_kv(self, slots: int, capacity: int) -> None:
        if capacity != self.plan.capacity:
            rebuild = ""
            if aligned_capacity(self.manifest, capacity) == capacity:
                rebuild = f" or rebuild with `edgeprefill build --capacity {capacity}`"
            raise BackendError(
                f"the TensorRT engine was built for a KV capacity of {self.plan.capacity}, "
                f"not {capacity}; run with max_context {self.plan.capacity}{rebuild}",
                "max_context",
            )
        self._free_kv()
        # Zero-filled: the standard graph attends over the whole capacity with an additive
        # mask, so never-written positions must hold finite numbers.
        try:
            for _ in self._pairs:
                self._arenas.append(self.device.alloc(slots * self.slot_bytes))
            self._spare = self.device.alloc(self.slot_bytes)
        except BackendError as err:
            self._free_kv()
            total = (slots * len(self._pairs) + 1) * self.slot_bytes
            # The settings' error, as the engine's own KV check: the CLI advises in flags.
            raise SettingError(f"cannot allocate the KV cache: {slots} slots x "
                               f"{len(self._pairs)} arenas = {total / 2**20:.0f} MiB on the GPU "
                               f"({err})", ("kv_slots", "max_context"),
                               ", or give a smaller kv_budget_bytes") from None
        self._slots = slots

    def run(self, step: StepBatch) -> np.ndarray:
        if not self._arenas:
            raise BackendError("allocate_kv must be called before run")
        logits = np.empty((step.rows, self._vocab), np.float32)
        for call in plan_calls(step, self.plan):
            self._execute(call)
            if call.last:
                self.device.download(logits[call.first_row : call.first_row + call.rows],
                                     self._stage[LOGITS])
        return logits

    def _execute(self, call: Call) -> None:
        # Stream order makes the next upload wait for the previous call to read its inputs.
        self.device.upload(self._stage[INPUT_IDS], call.input_ids)
        self.device.upload(self._stage[PAST_LENS], call.past_lens)
        self.device.upload(self._stage[VALID_LENS], call.valid_lens)
        bindings = call_bindings(call, self._buffers(), self._pairs, self._kv_shape, self._vocab,
                                 self._output.name)
        self.runtime.execute(call.profile, bindings)

    def _buffers(self) -> DeviceBuffers:
        s = self._stage
        return DeviceBuffers(
            s[INPUT_IDS], s[PAST_LENS], s[VALID_LENS], s[LOGITS],
            tuple(self._arenas), self.slot_bytes, self._slots,
        )

    def copy_kv(self, src_slot: int, dst_slot: int, length: int) -> None:
        self._check_slots(src_slot, dst_slot)
        for base in self._arenas:
            self._copy(base, src_slot, base, dst_slot, length)

    def swap_kv(self, a: int, b: int, length: int) -> None:
        self._check_slots(a, b)
        for base in self._arenas:
            self._copy(base, a, self._spare, 0, length)
            self._copy(base, b, base, a, length)
            self._copy(self._spare, 0, base, b, length)

    def _check_slots(self, *slots: int) -> None:
        # Device memory has no bounds check: a bad slot would corrupt another buffer.
        if any(not 0 <= s < self._slots for s in slots):
            raise BackendError(f"slots {slots} are not all in 0..{self._slots - 1}")

    def _copy(self, src_base: int, src: int, dst_base: int, dst: int, length: int) -> None:
        heads, capacity, dim = self._kv_shape
        for args in slot_prefix_copies(
            src_base, src, dst_base, dst, length, self.slot_bytes, heads, capacity,
            dim * self.kv_dtype.itemsize,
        ):
            self.device.copy_rows(*args)

    def kv_arrays(self) -> list[np.ndarray]:
        """The arena copied to the host, layer-major [K0, V0, K1, ...] (for inspection)."""
        arrays = []
        for base in self._arenas:
            host = np.empty((self._slots, *self._kv_shape), self.kv_dtype)
            self.device.download(host, base)
            arrays.append(host)
        return arrays

    def _free_kv(self) -> None:
        self.device.synchronize()
        for address in [*self._arenas, self._spare]:
            if address:
                self.device.free(address)
        self._arenas, self._spare, self._slots = [], 0, 0

    def close(self) -> None:
        self._free_kv()
        for address in self._stage.values():
            self.device.free(address)
        self._stage = {}
        self.runtime.close()


def _flat(pairs: list[list[str]]) -> list[str]:
    return [name for pair in pairs for name in pair]
