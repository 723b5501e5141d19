"""KVCache, Scheduler, StepRunner and the chunk controller on the fake backend alone:
no bundle, no torch, no Engine. The scheduling tests read the backend's call trace."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk.chunking import ChunkController
from edgeprefill.sdk.kv_cache import KVCache, SlotState
from edgeprefill.sdk.metrics import EngineCounters, RequestMetrics
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.priority import parse_priority
from edgeprefill.sdk.request import Phase, Request
from edgeprefill.sdk.scheduler import Scheduler, SchedulerConfig
from edgeprefill.sdk.step_runner import StepRunner
from tests.fake_backend import fake_backend


def ids(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 100, size=n)]


class Rig:
    """What Engine.step does, minus threads, sampling and streams: schedule, run the
    calls, take each row's argmax as its token, end a request after its tokens."""

    def __init__(self, slots: int = 2, context: int = 512, **config) -> None:
        config.setdefault("chunk_size", 64)
        self.backend = fake_backend(max_context=context)
        self.kv = KVCache(self.backend, slots, context, align=16)
        self.scheduler = Scheduler(SchedulerConfig(**config), self.kv, [16, 64])
        self.trace: list = []
        self.runner = StepRunner(self.backend, self.kv, self.scheduler.chunks,
                                 EngineCounters(), self.trace)
        self.ids = itertools.count(1)
        self.steps = 0
        self.first_token_step: dict[int, int] = {}

    def submit(self, n: int, priority: int = 0, new_tokens: int = 2, seed: int = 0):
        rid = next(self.ids)
        request = Request(
            id=rid, tokens=ids(n, seed), params=GenerationParams(max_new_tokens=new_tokens),
            priority=priority, arrival=rid, session_id=None, stream=None, sampler=None,
            text=None, metrics=RequestMetrics(arrival=0.0, prompt_tokens=n),
        )
        request.submitted_at = self.steps
        self.scheduler.add(request)
        return request

    def step(self) -> None:
        plan = self.scheduler.schedule()
        if plan.decode:
            for request, row in zip(plan.decode, self.runner.decode(plan.decode), strict=True):
                self._token(request, row)
        for chunk in plan.prefill:  # one: the plain fake backend does not fuse
            request = chunk.request
            logits = self.runner.prefill(chunk)
            if request.prefill_left == 0:
                self.scheduler.prefilled(request)
                self._token(request, logits[0])
        self.steps += 1

    def _token(self, request: Request, row: np.ndarray) -> None:
        request.generated.append(int(row.argmax()))
        self.first_token_step.setdefault(request.id, self.steps)
        if len(request.generated) >= request.params.max_new_tokens:
            self.scheduler.remove(request)
            self.kv.release(request.slot, keep=False)
            request.phase = Phase.DONE

    def prefill_slots(self) -> list[int]:
        return [c.first_slot for c in self.backend.prefills()]

    def prefill_order(self) -> list[int]:
        """Request ids in the order their prefill began."""
        return list(dict.fromkeys(t.request_ids[0] for t in self.trace if t.kind == "prefill"))


# -- the scheduler's groups ---------------------------------------------------------------


def test_queued_prefilling_and_decoding_are_counted_once_each():
    rig = Rig(slots=1)
    first, second, third = (rig.submit(40, seed=s) for s in range(3))
    assert (rig.scheduler.queue_depth, rig.scheduler.running) == (3, 0)
    rig.step()  # the first takes the only slot and prefills 40 tokens in one chunk
    assert first.phase is Phase.DECODE and second.phase is Phase.QUEUED
    assert (rig.scheduler.queue_depth, rig.scheduler.running) == (2, 1)
    assert rig.scheduler.live() == [second, third, first]
    while third.phase is not Phase.DONE:
        rig.step()
    assert (rig.scheduler.queue_depth, rig.scheduler.running) == (0, 0)
    rig.kv.check_integrity({})


def test_a_part_prefilled_request_is_neither_queued_nor_decoding():
    rig = Rig(slots=2)
    long = rig.submit(300)
    rig.step()
    assert rig.scheduler.prefilling == [long] and long.kv_len == 64
    assert rig.scheduler.queue_depth == 0 and rig.scheduler.running == 1


def test_the_queue_refuses_requests_beyond_its_limit():
    rig = Rig(max_queue=2)
    rig.submit(10)
    rig.submit(10)
    with pytest.raises(RequestError, match="queue is full"):
        rig.submit(10)


# -- prefill order ------------------------------------------------------------------------


def test_a_short_prompt_arriving_during_a_long_prefill_goes_next_at_equal_priority():
    rig = Rig(slots=2, context=4200)
    long = rig.submit(4000)
    for _ in range(3):
        rig.step()
    short = rig.submit(50, seed=1)
    rig.step()
    calls = rig.backend.prefills()
    assert [(c.first_slot, c.past_lens[0], c.valid_lens[0]) for c in calls] == [
        (long.slot, 0, 64), (long.slot, 64, 64), (long.slot, 128, 64), (short.slot, 0, 50)]
    assert rig.first_token_step[short.id] == short.submitted_at  # its first chunk
    while long.phase is not Phase.DECODE:
        rig.step()
    # The long prompt resumed where it stopped: every position computed exactly once.
    resumed = [c.past_lens[0] for c in rig.backend.prefills() if c.first_slot == long.slot]
    assert resumed == list(range(0, 4000, 64))


@pytest.mark.parametrize("aging", [64, 0])
def test_aging_bounds_the_wait_of_a_long_prompt_behind_a_stream_of_short_ones(aging):
    rig = Rig(slots=2, context=4200, aging_tokens=aging)
    long = rig.submit(4000)
    rig.step()
    shorts = []
    for step in range(200):
        shorts.append(rig.submit(50, new_tokens=1, seed=step + 1))  # one per chunk time
        rig.step()
    long_chunks = sum(s == long.slot for s in rig.prefill_slots())
    if aging == 0:  # shortest-first alone starves the long prompt
        assert long_chunks == 1
        return
    assert long.id in rig.first_token_step
    # It waited until its credit made it the shortest: (4000 - 64 - 50) / 64 chunks.
    assert rig.prefill_slots()[1:62] == [shorts[0].slot] * 61
    waits = [rig.first_token_step[s.id] - s.submitted_at for s in shorts[:60]]
    assert max(waits) == 0  # before that, every short one was served on arrival


def test_a_lower_priority_value_is_served_first_whatever_the_length():
    rig = Rig(slots=3)
    background = rig.submit(20, priority=parse_priority("low"))
    urgent_long = rig.submit(300, priority=parse_priority("high"), seed=1)
    normal = rig.submit(20, seed=2)
    while urgent_long.phase is not Phase.DECODE:
        rig.step()
    assert set(rig.prefill_slots()) == {urgent_long.slot}
    while background.phase is Phase.QUEUED or background.phase is Phase.PREFILL:
        rig.step()
    assert rig.prefill_order() == [urgent_long.id, normal.id, background.id]


def test_arrival_order_policies_ignore_priority_and_length():
    rig = Rig(slots=2, policy="chunked")
    long = rig.submit(300)
    rig.step()
    short = rig.submit(20, priority=-5, seed=1)
    while long.phase is not Phase.DECODE:
        rig.step()
    assert short.phase is Phase.QUEUED or short.kv_len == 0
    assert set(rig.prefill_slots()) == {long.slot}


@pytest.mark.parametrize("value, expected", [
    (0, 0), (-3, -3), ("high", -1), ("Normal", 0), (" low ", 1), ("7", 7)])
def test_parse_priority_takes_integers_and_names(value, expected):
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", ["urgent", 1.5, True, None, 2**31])
def test_parse_priority_refuses_anything_else_in_one_line(value):
    with pytest.raises(RequestError, match="priority must be"):
        parse_priority(value)


# -- the step runner ----------------------------------------------------------------------


def test_decode_rows_are_one_call_over_adjacent_slots_after_a_middle_one_ends():
    rig = Rig(slots=3)
    streams = [rig.submit(20, new_tokens=n, seed=i) for i, n in enumerate([30, 3, 30])]
    while any(r.phase is not Phase.DONE for r in streams):
        rig.step()
        rig.kv.check_integrity({r.slot: r for r in rig.scheduler.live() if r.slot is not None})
    decodes = [c for c in rig.backend.calls if c.kind == "decode"]
    assert max(c.rows for c in decodes) == 3
    # After the middle request ended, the third slot moved into its hole: still one call.
    assert all(c.first_slot == 0 for c in decodes if c.rows > 1)
    assert [c.rows for c in decodes].count(2) > 20
    assert [t.kind for t in rig.trace].count("decode") == len(decodes)


def test_the_runner_counts_tokens_and_feeds_the_chunk_controller():
    rig = Rig(slots=2)
    request = rig.submit(100, new_tokens=5)
    while request.phase is not Phase.DONE:
        rig.step()
    counters = rig.runner.counters
    assert counters.prefill_tokens == 100 and counters.decode_tokens == 4
    assert counters.decode_steps == 4 and request.metrics.chunks == 2
    assert set(rig.scheduler.chunks.per_token) == {64, 16}  # chunks of 64 and 36 tokens
    assert rig.scheduler.chunks.decode_s is not None


# -- KVCache ------------------------------------------------------------------------------


def make_cache(slots: int = 3, capacity: int = 128, **options) -> KVCache:
    return KVCache(fake_backend(max_context=capacity), slots, capacity, align=16, **options)


def fill(cache: KVCache, tokens: list[int], owner: int | None = None) -> int:
    """Acquire a slot for `tokens` and write their KV as a prefill would."""
    got = cache.acquire(tokens, owner)
    assert got is not None
    cache.backend.kv[got.slot, got.reused : len(tokens)] = tokens[got.reused :]
    cache.extend(got.slot, tokens[got.reused :])
    return got.slot


def test_a_retained_prefix_is_lent_chunk_aligned_and_only_when_the_tokens_match():
    cache = make_cache()
    shared = ids(40)
    first = fill(cache, shared + ids(10, 1))
    cache.release(first, keep=True)
    got = cache.acquire(shared + ids(10, 2), None)
    assert (got.reused, got.copied_from) == (32, first)  # 40 shared, aligned down to 16
    assert cache.backend.kv[got.slot, :32].tolist() == shared[:32]
    other = cache.acquire(ids(50, 9), None)
    assert other.reused == 0 and other.copied_from is None
    assert (cache.prefix_lookups, cache.prefix_hits) == (3, 1)  # one per acquire


def test_without_prefix_sharing_only_a_session_reuses_its_own_slot():
    cache = make_cache(share_prefixes=False)
    turn = ids(30)
    slot = fill(cache, turn, owner=7)
    cache.release(slot, keep=True)
    assert cache.acquire(turn + ids(5, 1), None).reused == 0  # not the owner
    again = cache.acquire(turn + ids(5, 2), 7)
    assert (again.slot, again.reused) == (slot, 30)


def test_a_session_owns_one_slot_when_two_of_its_requests_run_at_once():
    """Engine.submit with a session's id while its last turn still runs: the newer one
    takes the session's slot, the older one's becomes a plain entry (the sweep of
    runtime checks found a session owning both, which check_integrity refuses)."""
    cache = make_cache()
    older = fill(cache, ids(20), owner=7)  # still ACTIVE
    newer = fill(cache, ids(20) + ids(10, 1), owner=7)
    assert newer != older
    assert [s.owner for s in cache.slots if s.owner is not None] == [7]
    assert cache.slots[newer].owner == 7
    cache.release(older, keep=True)
    cache.release(newer, keep=True)
    cache.check_integrity()
    again = cache.acquire(ids(20) + ids(10, 1) + ids(5, 2), 7)
    assert (again.slot, again.reused) == (newer, 30)


def test_every_slot_busy_means_wait_and_eviction_prefers_plain_prefix_entries():
    cache = make_cache(slots=2)
    session = fill(cache, ids(20), owner=1)
    plain = fill(cache, ids(20, 1))
    assert cache.acquire(ids(20, 2), None) is None
    cache.release(plain, keep=True)
    cache.release(session, keep=True)  # more recent, but a session's conversation
    assert cache.acquire(ids(20, 3), None).slot == plain


def test_with_every_slot_taken_a_retained_prefix_is_reused_in_place_not_evicted():
    cache = make_cache(slots=2)
    prompt = ids(40)
    old = fill(cache, ids(20, 1))
    match = fill(cache, prompt)
    cache.release(match, keep=True)  # the least recently used: the LRU rule evicted it
    cache.release(old, keep=True)
    got = cache.acquire(prompt + ids(5, 2), None)
    assert (got.slot, got.reused, got.copied_from) == (match, 40, None)
    assert cache.slots[old].tokens == ids(20, 1)  # the other entry kept
    cache.release(match, keep=True)
    unrelated = cache.acquire(ids(30, 3), None)  # no match: the LRU rule as before
    assert (unrelated.slot, unrelated.reused) == (old, 0)


def test_a_prefix_too_short_to_lend_never_takes_a_long_cached_prompts_slot():
    """A BOS or a chat header is shared with every slot: taking the most recent slot for
    those tokens evicted a long prompt the next request would have reused."""
    cache = make_cache(slots=2)
    header = ids(2, 5)
    old = fill(cache, header + ids(20, 1))
    long = fill(cache, header + ids(60, 2))
    cache.release(old, keep=True)
    cache.release(long, keep=True)  # the most recent
    short = cache.acquire(header + ids(10, 3), None)
    assert short.slot == old  # least recently used, as before
    assert cache.slots[long].tokens == header + ids(60, 2)


def test_compact_moves_slots_together_and_their_kv_with_them():
    cache = make_cache(slots=4)
    a, b, c = (fill(cache, ids(20, s)) for s in range(3))
    before = {s: cache.backend.kv[s, :20].tolist() for s in (a, c)}
    cache.release(b, keep=False)
    moved = cache.compact([a, c])
    assert moved == {c: b, b: c}
    assert cache.backend.kv[b, :20].tolist() == before[c]
    assert cache.slots[b].tokens == before[c] and cache.slots[c].state is SlotState.FREE
    cache.check_integrity({a: "a", b: "c"})


def test_integrity_check_catches_an_active_slot_nobody_holds():
    cache = make_cache()
    fill(cache, ids(20))
    with pytest.raises(AssertionError, match="active slots"):
        cache.check_integrity({})


# -- the chunk controller -----------------------------------------------------------------


def test_chunk_controller_probes_small_then_takes_the_largest_bucket_that_fits():
    controller = ChunkController([16, 64, 256], itl_target_s=0.05)
    assert controller.choose(decoding=False) == 256  # nobody waits: throughput
    assert controller.choose(decoding=True) == 16  # nothing measured: probe the smallest
    controller.observe_decode(0.01)
    controller.observe_prefill(16, 0.008)  # 0.5 ms per token
    # 64 is predicted from 16's rate (32 ms): fits in 40 ms; 256 would take 128 ms.
    assert controller.choose(decoding=True) == 64
    controller.observe_prefill(64, 0.064)  # measured slower: 1 ms per token, 64 ms
    assert controller.choose(decoding=True) == 16


def test_a_fused_chunk_has_the_whole_target_to_itself():
    """A fused call's measured time holds the decode rows: no decode call is added."""
    controller = ChunkController([16, 64, 256], itl_target_s=0.07)
    controller.observe_decode(0.01)
    controller.observe_prefill(64, 0.064)  # 1 ms per token
    assert controller.choose(decoding=True) == 16  # 10 + 64 ms > 70
    assert controller.choose(decoding=True, fused=True) == 64  # 64 ms <= 70


def test_chunk_controller_smooths_its_measurements():
    controller = ChunkController([16, 64], itl_target_s=0.1)
    controller.observe_decode(0.010)
    controller.observe_decode(0.020)
    assert controller.decode_s == pytest.approx(0.7 * 0.010 + 0.3 * 0.020)
