"""The engine's profile plan and how a step becomes engine calls: plain functions."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.engines import StepBatch
from edgeprefill.engines.trt.plan import ShapeRange, profile_plan
from edgeprefill.engines.trt.steps import (
    DeviceBuffers,
    RowCopy,
    call_bindings,
    plan_calls,
    slot_prefix_copies,
    staging_sizes,
)
from edgeprefill.errors import BackendError
from tests.trt_fakes import KV, VOCAB, D
from tests.trt_fakes import fake_manifest as manifest


def step(ids, past, first_slot=0, valid=None) -> StepBatch:
    ids = np.array(ids, np.int64)
    valid = [ids.shape[1]] * ids.shape[0] if valid is None else valid
    return StepBatch(ids, np.array(past, np.int32), np.array(valid, np.int32), first_slot)


def test_one_fixed_profile_per_bucket_and_a_decode_profile_last():
    plan = profile_plan(manifest(), capacity=256, max_batch=4)
    assert [p.name for p in plan.profiles] == ["prefill-16", "prefill-64", "decode"]
    assert plan.decode_index == 2 and plan.bucket_index(64) == 1
    prefill = plan.profiles[1].shapes
    assert prefill["input_ids"] == ShapeRange((1, 64), (1, 64), (1, 64))
    assert prefill["past_lens"] == prefill["valid_lens"] == ShapeRange((1,), (1,), (1,))
    assert prefill["past_key.0"] == ShapeRange(*[(1, KV, 256, D)] * 3)
    decode = plan.profiles[2].shapes
    assert decode["input_ids"] == ShapeRange((1, 1), (4, 1), (4, 1))
    assert decode["past_value.0"] == ShapeRange((1, KV, 256, D), (4, KV, 256, D), (4, KV, 256, D))
    assert set(decode) == set(manifest().graph.inputs)


def test_buckets_of_one_or_over_the_capacity_get_no_prefill_profile():
    plan = profile_plan(manifest(chunks=(1, 16, 64, 256)), capacity=64, max_batch=2)
    assert plan.buckets == (16, 64)
    assert [p.name for p in plan.profiles] == ["prefill-16", "prefill-64", "decode"]


@pytest.mark.parametrize("capacity,max_batch", [(1, 4), (257, 4), (64, 0)])
def test_bad_capacity_or_batch_is_refused(capacity, max_batch):
    with pytest.raises(BackendError):
        profile_plan(manifest(), capacity, max_batch)


def test_a_prefill_row_is_cut_into_bucket_pieces_and_padded():
    plan = profile_plan(manifest(), 256, 4)
    calls = plan_calls(step([list(range(3, 73))], [10], first_slot=2), plan)
    assert [(c.profile, c.input_ids.shape, int(c.past_lens[0]), int(c.valid_lens[0]), c.last)
            for c in calls] == [(1, (1, 64), 10, 64, False), (0, (1, 16), 74, 6, True)]
    assert list(calls[1].input_ids[0]) == list(range(67, 73)) + [0] * 10
    assert all(c.first_slot == 2 for c in calls)


def test_only_valid_tokens_of_a_padded_step_are_sent():
    plan = profile_plan(manifest(), 256, 4)
    (call,) = plan_calls(step([[5, 6, 7, 0, 0]], [0], valid=[3]), plan)
    assert list(call.input_ids[0, :4]) == [5, 6, 7, 0] and int(call.valid_lens[0]) == 3


def test_near_the_capacity_pieces_shrink_then_go_token_by_token():
    plan = profile_plan(manifest(), 100, 4)
    calls = plan_calls(step([list(range(3, 23))], [70]), plan)  # 70 + 64 > 100, 70 + 16 fits
    assert [(c.profile, int(c.past_lens[0]), int(c.valid_lens[0])) for c in calls] == [
        (0, 70, 16), (2, 86, 1), (2, 87, 1), (2, 88, 1), (2, 89, 1)]


def test_a_row_past_the_capacity_or_without_tokens_is_refused():
    plan = profile_plan(manifest(), 64, 4)
    with pytest.raises(BackendError, match="over the KV capacity"):
        plan_calls(step([[5] * 10], [60]), plan)
    with pytest.raises(BackendError, match="no valid token"):
        plan_calls(step([[5, 6]], [0], valid=[0]), plan)


def test_decode_rows_run_in_groups_of_the_profiles_batch():
    plan = profile_plan(manifest(), 64, 2)
    calls = plan_calls(step([[5], [6], [7]], [3, 4, 5], first_slot=1), plan)
    assert [(c.first_row, c.first_slot, c.rows, c.last) for c in calls] == [
        (0, 1, 2, True), (2, 3, 1, True)]
    assert [list(c.past_lens) for c in calls] == [[3, 4], [5]]


def test_bindings_put_both_kv_names_at_the_rows_slot_address():
    plan = profile_plan(manifest(layers=2), 64, 4)
    (call,) = plan_calls(step([[5], [6]], [3, 4], first_slot=1), plan)
    slot_bytes = KV * 64 * D * 4
    buffers = DeviceBuffers(100, 200, 300, 400, (10_000, 20_000, 30_000, 40_000), slot_bytes, 3)
    pairs = [("past_key.0", "present_key.0"), ("past_value.0", "present_value.0"),
             ("past_key.1", "present_key.1"), ("past_value.1", "present_value.1")]
    bound = call_bindings(call, buffers, pairs, (KV, 64, D), VOCAB)
    assert bound["input_ids"] == (100, (2, 1)) and bound["logits"] == (400, (2, VOCAB))
    assert bound["past_lens"] == (200, (2,)) and bound["valid_lens"] == (300, (2,))
    for (past, present), base in zip(pairs, buffers.kv, strict=True):
        assert bound[past] == bound[present] == (base + slot_bytes, (2, KV, 64, D))
    late = call._replace(first_slot=2)
    with pytest.raises(BackendError, match="not allocated"):
        call_bindings(late, buffers, pairs, (KV, 64, D), VOCAB)


def test_a_slot_prefix_copy_is_one_strided_copy_per_arena():
    copies = slot_prefix_copies(1000, 1, 5000, 2, length=3, slot_bytes=400, heads=2,
                                capacity=10, position_bytes=20)
    assert copies == [RowCopy(dst=5000 + 800, dst_pitch=200, src=1000 + 400, src_pitch=200,
                              width=60, height=2)]
    assert slot_prefix_copies(0, 0, 0, 1, 0, 400, 2, 10, 20) == []
    with pytest.raises(BackendError):
        slot_prefix_copies(0, 0, 0, 1, 11, 400, 2, 10, 20)


def test_staging_buffers_fit_the_largest_call():
    assert staging_sizes(profile_plan(manifest(), 256, 4)) == (4, 64)
    assert staging_sizes(profile_plan(manifest(chunks=(2,)), 256, 8)) == (8, 8)
