"""The backend contract: run one step of the chunk graph against a KV arena it owns.

A backend knows graphs and buffers, nothing about sessions or scheduling. The KV cache
is one arena per layer and per K/V (one per layer where its value is its key:
contract.kv_buffers), `[slots, kv_heads, capacity, head_dim]`, with the
slot as the first axis: a prefill chunk of slot s binds `arena[s:s+1]` and a decode batch
of slots a..b-1 binds `arena[a:b]`, both contiguous views, so no step copies the cache.

A model with state layers (LFM2, Qwen3.5) also keeps, per slot, each such layer's
recurrent states (`[slots, ...]`, shaped as the graph's state inputs): the slot's KV and
its states describe the same tokens, so copying or swapping a slot's KV copies or swaps
its states too. A state cannot be cut back to fewer tokens: kv_cache.py keeps copies of a
slot's states at some positions (`save_state`) and restores one (`restore_state`) to
reuse a prefix that ends there.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from edgeprefill.bundle import Manifest, ModelInfo
from edgeprefill.contract import attention_layers, state_slot_bytes
from edgeprefill.env_choice import env_choice
from edgeprefill.errors import BackendError


class StepBatch(NamedTuple):
    """One engine call: B rows of C tokens, row r in KV slot `first_slot + r`."""

    input_ids: np.ndarray  # CPU [B, C] int64
    past_lens: np.ndarray  # CPU [B] int32: tokens already in the row's cache
    valid_lens: np.ndarray  # CPU [B] int32: valid tokens of the row (rest is padding)
    first_slot: int

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def chunk(self) -> int:
        return int(self.input_ids.shape[1])


COMPUTES = ("fp32", "bf16")  # BackendOptions.compute
SPIN_ENV = "EDGEPREFILL_SPIN"  # BackendOptions.spin's default: on or off


def spin_default() -> bool:
    """Whether compute threads spin where the caller did not say (`SPIN_ENV`; on when unset;
    another value than on or off is refused in one line)."""
    return env_choice(SPIN_ENV, ("on", "off")) == "on"


@dataclass(frozen=True)
class BackendOptions:
    device: str = "cpu"  # "cpu", "cuda" or "tensorrt" (TensorRT EP / engine)
    threads: int | None = None  # intra-op threads; None: the physical cores
    optimize: bool = True  # full graph optimizations (ORT_ENABLE_ALL)
    engine_dir: Path | None = None  # where compiled engines are cached (GPU paths)
    # Compute threads busy-wait briefly for the next op while a step runs, and stop the
    # moment it returns (ONNX Runtime's force_spinning_stop), so they never hold a core
    # while the engine samples and schedules between steps. On a quiet 2-core VM this was
    # 1.3x faster to prefill and 1.4x to decode than sleeping threads; on a machine shared
    # with other busy processes sleeping threads won (docs/benchmarks.md, *Spin*): spin=False.
    # None: spin_default(), on unless EDGEPREFILL_SPIN=off (a whole process's engines at
    # once: a deployment beside other busy processes, the test suite's two processes).
    spin: bool | None = None
    # "fp32" (exact) or "bf16": float32 bundles' projections and every bundle's prefill
    # attention in bf16 on the native kernels (engines/ort/bf16_compute.py), as OpenVINO
    # computes by default on CPUs with bf16, and the KV cache where only they read it
    # (engines/ort/bf16_kv.py).
    compute: str = "fp32"


def kv_slot_bytes(model: ModelInfo, capacity: int, dtype: np.dtype | str,
                  state_bytes: int = 0, value_is_key: Collection[int] = ()) -> int:
    """Bytes of KV cache one slot of `capacity` positions takes, all layers, at `dtype`,
    plus the slot's recurrent state (`state_bytes`, contract.state_slot_bytes, which keeps
    the graph's dtypes): what `kv_budget_bytes` is divided by. The layers in
    `value_is_key` hold one buffer as both their caches (contract.kv_buffers)."""
    layers = attention_layers(model.num_layers, model.no_kv_layers)
    per_position = sum((1 if i in value_is_key else 2) * math.prod(model.kv_dims(i))
                       for i in layers)
    return per_position * capacity * int(np.dtype(dtype).itemsize) + state_bytes


def warm_up_prefill(length: int) -> StepBatch:
    """A warm-up's prefill: `length` tokens into slot 0 from position 0."""
    return StepBatch(np.zeros((1, length), np.int64), np.zeros(1, np.int32),
                     np.full(1, length, np.int32), 0)


def warm_up_decode(rows: int) -> StepBatch:
    """A warm-up's decode step: a first token in each of slots 0..rows-1 (at position 0, so
    it attends to nothing it did not write)."""
    return StepBatch(np.zeros((rows, 1), np.int64), np.zeros(rows, np.int32),
                     np.ones(rows, np.int32), 0)


class Backend(ABC):
    """Loads a bundle's graph for a device and runs steps. Implementations are small."""

    name: str

    def __init__(self, bundle_dir: Path, manifest: Manifest, options: BackendOptions) -> None:
        self.bundle_dir = bundle_dir
        self.manifest = manifest
        self.options = options

    @property
    def why_not_fused(self) -> str | None:
        """Why this backend runs a prefill chunk and the decode rows in two calls, or None
        where one call gives every row its own tokens at the cost of its valid tokens (the
        graph packs them: `GraphInfo.packed_tokens`; engines/ort/fusing.py)."""
        return "this backend's engines take one kind of call at a time"

    @property
    def fuses_rows(self) -> bool:
        """The runtime may run a prefill chunk beside the decode rows in one call."""
        return self.why_not_fused is None

    @property
    def carries_state(self) -> bool:
        """Slots hold a recurrent state beside the KV (state layers): a slot's cache is
        reusable whole or up to a snapshot of its states (`save_state`), never cut back
        by its KV alone."""
        return bool(self.manifest.model.state_layers)

    @property
    def kv_dtype(self) -> np.dtype:
        return np.dtype(self.manifest.graph.dtype)

    def kv_slot_bytes(self, capacity: int) -> int:
        """Bytes of KV cache one slot of `capacity` positions takes, all layers, with its
        recurrent state."""
        return kv_slot_bytes(self.manifest.model, capacity, self.kv_dtype, self.state_bytes(),
                             self.value_is_key)

    @property
    def value_is_key(self) -> list[int]:
        """The layers whose one KV buffer is bound as both their key and value caches
        (the manifest's graph.value_is_key where the backend does so); by default none."""
        return []

    def state_bytes(self) -> int:
        """Bytes of recurrent state one slot holds (0 without state layers)."""
        return state_slot_bytes(self.manifest.graph)

    @abstractmethod
    def allocate_kv(self, slots: int, capacity: int) -> None:
        """(Re)allocate the KV arena: `slots` rows of `capacity` positions, zero-filled
        (and the conv layers' state, if any). Drops any previous arena."""

    def warm_up_steps(self, length: int, slots: int) -> list[StepBatch]:
        """The calls the load runs before the first request (sdk/step_runner.warm_up): by
        default one prefill chunk of `length` tokens into slot 0 and one decode step of a
        first token in every slot. Their K/V is garbage no request reads: no slot records
        it, and a request writes each position it attends to before it does."""
        return [warm_up_prefill(length), warm_up_decode(slots)]

    @abstractmethod
    def run(self, step: StepBatch) -> np.ndarray:
        """Run one step; returns CPU float32 logits [B, vocab] of each row's last valid
        token. Writes the rows' K/V (and conv state) into their slots; touches no other
        slot."""

    @abstractmethod
    def copy_kv(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy positions [0, length) of one slot's K/V to another (prefix reuse), and
        the slot's conv state, if any (the caller copies only a whole slot then)."""

    @abstractmethod
    def swap_kv(self, a: int, b: int, length: int) -> None:
        """Exchange positions [0, length) of two slots' K/V (keeps decode rows adjacent),
        and their conv states, if any."""

    def save_state(self, slot: int) -> object:
        """A copy of the slot's recurrent states as they are now (after its last step),
        which `restore_state` can put into any slot later; never changed once made. Only
        for a backend that `carries_state`."""
        raise BackendError(f"the {self.name} backend keeps no recurrent state")

    def restore_state(self, saved: object, slot: int) -> None:
        """Overwrite the slot's recurrent states with `saved` (from `save_state`)."""
        raise BackendError(f"the {self.name} backend keeps no recurrent state")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release device resources."""
