"""How one StepBatch becomes TensorRT engine calls, and which address and shape each tensor
of a call is bound to. Pure logic: the TensorRT backend only moves the bytes.

A prefill row is cut into pieces that each fit a bucket profile, padded to the bucket (the
graph masks padding through `valid_lens`). A padded piece writes K/V for its padded
positions too, so a piece may only use a bucket that ends inside the capacity; when none
does (the last tokens of a nearly full slot), the row goes on one token at a time through
the decode profile. Decode rows run in groups of at most the decode profile's batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from edgeprefill.contract import INPUT_IDS, LOGITS, PAST_LENS, VALID_LENS
from edgeprefill.engines.base import StepBatch
from edgeprefill.engines.trt.plan import ProfilePlan, Shape
from edgeprefill.errors import BackendError

PAD_ID = 0  # any id inside the vocabulary: padded positions are masked


class Call(NamedTuple):
    """One engine execution: rows [first_row, first_row + rows) of the step."""

    profile: int  # optimization profile index
    first_row: int
    first_slot: int
    input_ids: np.ndarray  # CPU [rows, C] int64, C = the profile's chunk (padded)
    past_lens: np.ndarray  # CPU [rows] int32
    valid_lens: np.ndarray  # CPU [rows] int32
    last: bool  # its logits are the answer for its rows

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


class TensorBinding(NamedTuple):
    address: int  # device pointer
    shape: Shape


@dataclass(frozen=True)
class DeviceBuffers:
    """Device addresses the backend owns. KV arenas are slot-first `[slots, KV, cap, D]`."""

    input_ids: int  # staging [max rows * max chunk] int64
    past_lens: int  # staging [max rows] int32
    valid_lens: int  # staging [max rows] int32
    logits: int  # [max rows, vocab] float32
    kv: tuple[int, ...]  # arena base per KV tensor, layer-major [K0, V0, K1, V1, ...]
    slot_bytes: int  # bytes of one slot in one arena: KV * cap * D * itemsize
    slots: int


def plan_calls(step: StepBatch, plan: ProfilePlan) -> list[Call]:
    """The engine calls that run `step`, in order."""
    if step.chunk == 1:
        return _decode_calls(step, plan)
    calls: list[Call] = []
    for row in range(step.rows):
        calls += _row_calls(step, row, plan)
    return calls


def _decode_calls(step: StepBatch, plan: ProfilePlan) -> list[Call]:
    calls = []
    for start in range(0, step.rows, plan.max_batch):
        rows = slice(start, min(start + plan.max_batch, step.rows))
        calls.append(Call(
            plan.decode_index, start, step.first_slot + start,
            np.ascontiguousarray(step.input_ids[rows], np.int64),
            np.ascontiguousarray(step.past_lens[rows], np.int32),
            np.ones(rows.stop - rows.start, np.int32), last=True,
        ))
    _check_fits(calls, plan.capacity)
    return calls


def _row_calls(step: StepBatch, row: int, plan: ProfilePlan) -> list[Call]:
    valid = int(step.valid_lens[row])
    if valid < 1:
        raise BackendError(f"row {row} of the step has no valid token")
    tokens = step.input_ids[row, :valid]
    position = int(step.past_lens[row])
    if position + valid > plan.capacity:
        raise BackendError(
            f"row {row} needs positions up to {position + valid}, over the KV capacity "
            f"{plan.capacity}"
        )
    calls, done = [], 0
    while done < valid:
        length, bucket, profile = _piece(valid - done, position, plan)
        ids = np.full((1, bucket), PAD_ID, np.int64)
        ids[0, :length] = tokens[done : done + length]
        calls.append(Call(
            profile, row, step.first_slot + row, ids,
            np.array([position], np.int32), np.array([length], np.int32), last=False,
        ))
        done += length
        position += length
    calls[-1] = calls[-1]._replace(last=True)
    return calls


def _piece(left: int, position: int, plan: ProfilePlan) -> tuple[int, int, int]:
    """(tokens, padded length, profile) of the next piece of a prefill row."""
    fitting = [b for b in plan.buckets if position + b <= plan.capacity]
    if left == 1 or not fitting:
        return 1, 1, plan.decode_index
    length = min(left, fitting[-1])
    bucket = next(b for b in fitting if b >= length)
    return length, bucket, plan.bucket_index(bucket)


def _check_fits(calls: list[Call], capacity: int) -> None:
    for call in calls:
        if int(call.past_lens.max()) + call.input_ids.shape[1] > capacity:
            raise BackendError(f"a decode row would write past the KV capacity {capacity}")


def call_bindings(
    call: Call, buffers: DeviceBuffers, kv_pairs: list[tuple[str, str]], kv_shape: Shape,
    vocab: int, output: str = LOGITS,
) -> dict[str, TensorBinding]:
    """Address and shape of every graph input and output for one call. `output`: the name
    of the [rows, vocab] output (an embedding bundle's `hidden`, of its hidden size).

    `kv_pairs` lists per KV tensor its [input, output] names, in the arena order; both are
    bound to the same address, so the engine updates the cache in place.
    """
    rows, chunk = call.input_ids.shape
    if call.first_slot < 0 or call.first_slot + rows > buffers.slots:
        raise BackendError(f"slots {call.first_slot}..{call.first_slot + rows - 1} "
                           f"are not allocated ({buffers.slots} slots)")
    bound = {
        INPUT_IDS: TensorBinding(buffers.input_ids, (rows, chunk)),
        PAST_LENS: TensorBinding(buffers.past_lens, (rows,)),
        VALID_LENS: TensorBinding(buffers.valid_lens, (rows,)),
        output: TensorBinding(buffers.logits, (rows, vocab)),
    }
    offset = call.first_slot * buffers.slot_bytes  # slot-first: rows are contiguous
    for (past, present), base in zip(kv_pairs, buffers.kv, strict=True):
        view = TensorBinding(base + offset, (rows, *kv_shape))
        bound[past] = view
        bound[present] = view
    return bound


class RowCopy(NamedTuple):
    """A 2D device copy: `height` rows of `width` bytes (cudaMemcpy2D's arguments)."""

    dst: int
    dst_pitch: int
    src: int
    src_pitch: int
    width: int
    height: int


def slot_prefix_copies(
    src_base: int, src_slot: int, dst_base: int, dst_slot: int, length: int,
    slot_bytes: int, heads: int, capacity: int, position_bytes: int,
) -> list[RowCopy]:
    """Copy positions [0, length) of one slot to another: per KV head, `length` positions
    of `position_bytes` each, the heads `capacity` positions apart."""
    if not 0 <= length <= capacity:
        raise BackendError(f"cannot copy {length} positions of a {capacity}-position slot")
    if length == 0:
        return []
    pitch = capacity * position_bytes
    return [RowCopy(
        dst_base + dst_slot * slot_bytes, pitch, src_base + src_slot * slot_bytes, pitch,
        length * position_bytes, heads,
    )]


def staging_sizes(plan: ProfilePlan) -> tuple[int, int]:
    """(max rows, max tokens) of one call: sizes of the staging buffers."""
    rows = plan.max_batch
    tokens = max([plan.max_batch, *plan.buckets])
    return rows, tokens
