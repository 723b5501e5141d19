"""Prefix reuse on models whose layers carry a recurrent state (LFM2, LFM3, Qwen3.5): the KV
cache keeps snapshots of a slot's states at chunk-aligned positions and reuses a prefix
up to one (kv_cache.py). Each reuse is checked against transformers' greedy text of the
whole prompt, run unchunked and uncached, and the reused count against the snapshot the
prefix should have come from."""

from __future__ import annotations

import pytest

from edgeprefill.sdk import Engine, GenerationParams
from edgeprefill.sdk.state_snapshots import snapshot_budget
from tests.test_exactness import prompt_ids, reference_greedy

FAMILIES = ("lfm2", "lfm3", "qwen3_5_text", "granitemoehybrid-mamba", "falcon_h1",
            "kimi_linear", "zaya", "inkling_text")
# A snapshot is the state arena's rows of a slot, whatever the states hold: the default
# suite keeps one family per kind of state (LFM3's conv beside sliding KV, Qwen3.5's
# DeltaNet, Granite 4.0-H's Mamba-2); LFM2 (conv only), Falcon-H1 (Mamba-2 again) and Kimi
# Linear (DeltaNet's states, shaped alike; test_state_runtime resumes its snapshots) run
# under slow; ZAYA's (a short convolution's window beside a value of one token, next to
# its KV) in the default suite; Inkling's (four short convolutions' windows beside its KV,
# ZAYA's kind) under slow.
REPEATED = ("lfm2", "falcon_h1", "kimi_linear", "inkling_text")
PARAMS = GenerationParams(max_new_tokens=8, ignore_eos=True)

pytestmark = pytest.mark.parametrize("family", [
    pytest.param(family, marks=pytest.mark.slow) if family in REPEATED else family
    for family in FAMILIES])


def _load(bundle, family: str, **options) -> Engine:
    """An engine whose slots keep a snapshot at every multiple of 16 these tests reach,
    whatever the fixture's state size (the budget is tested on its own)."""
    engine = Engine.load(bundle(family), threads=2, background=False, **options)
    engine.kv.max_snapshots = 32
    return engine


def _positions(engine: Engine, slot: int) -> list[int]:
    return [s.position for s in engine.kv.slots[slot].snapshots]


def test_a_shared_system_prompt_is_lent_from_a_snapshot(family, hf_model, bundle):
    """Chunks of 24 end at 16 and 32 (cut where a snapshot is kept; the last, which ends
    the prompt, is not cut): the second prompt shares 40 tokens, so it copies 32
    positions and restores the states there."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=24)
    system = prompt_ids(40)
    first = system + prompt_ids(13, seed=5)[1:]
    second = system + prompt_ids(11, seed=6)[1:]
    assert engine.generate(first, PARAMS).result().token_ids == reference_greedy(hf_dir, first)
    assert _positions(engine, 0) == [16, 32]
    hits = engine.kv.prefix_hits
    got = engine.generate(second, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, second)
    assert got.metrics.prefix_reused == 32
    assert engine.kv.prefix_hits == hits + 1
    # The lent prefix's snapshots came along: the second slot can lend it in turn.
    assert _positions(engine, 1)[:2] == [16, 32]
    engine.close()
    assert not any(slot.snapshots for slot in engine.kv.slots)  # freed with the backend


def test_a_request_parting_from_a_cached_prompt_keeps_a_snapshot_there_for_the_next(
        family, hf_model, bundle):
    """The first prompt runs in one call (chunks of 64): no snapshot. The second shares
    its 40-token system prompt, reuses nothing, and its chunk ends at 32 (its mark), so
    a snapshot is kept there; the third reuses 32 tokens from it."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=64)
    system = prompt_ids(40)
    prompts = [system + prompt_ids(13, seed=seed)[1:] for seed in (5, 6, 7)]
    got = [engine.generate(p, PARAMS).result() for p in prompts]
    assert [g.token_ids for g in got] == [reference_greedy(hf_dir, p) for p in prompts]
    assert [g.metrics.prefix_reused for g in got] == [0, 0, 32]
    assert [g.metrics.chunks for g in got] == [1, 2, 1]
    engine.close()


def test_an_edited_last_turn_resumes_from_a_snapshot_taken_while_decoding(family, hf_model,
                                                                          bundle):
    """The slot holds the first prompt (45) and 7 of its reply's tokens; a decode step
    landed on 48. The edit keeps 5 reply tokens (50 in common): 48 are reused."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=16, kv_slots=1)
    first = prompt_ids(45)
    reply = engine.generate(first, PARAMS).result().token_ids
    assert _positions(engine, 0) == [16, 32, 48]
    edited = first + reply[:5] + prompt_ids(12, seed=8)[1:]
    got = engine.generate(edited, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, edited)
    assert got.metrics.prefix_reused == 48
    engine.close()


@pytest.mark.parametrize("slots", [1, 4])
def test_n_choices_are_greedy_whether_forked_or_resumed_from_a_snapshot(family, slots,
                                                                        hf_model, bundle):
    """With a free slot the sibling forks the prompt's slot; with none it waits, then
    takes the slot back (its prompt is a prefix of the slot's tokens but for the last
    one) from the snapshot at 32."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=16, kv_slots=slots)
    prompt = prompt_ids(40)
    streams = engine.submit_n(prompt, PARAMS, 2)
    want = reference_greedy(hf_dir, prompt)
    assert [s.result().token_ids for s in streams] == [want, want]
    assert streams[1].metrics.prefix_reused == (40 if slots > 1 else 32)
    engine.close()


def test_a_slots_snapshots_past_what_it_keeps_are_dropped(family, hf_model, bundle):
    """The one slot holds a first prompt's states at 16 and 32; a second prompt shares
    20 tokens, takes the slot back to 16 and writes its own 32. A third sharing 35 tokens
    with the second restores the second's states at 32, never the first's."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=16, kv_slots=1)
    first = prompt_ids(40)
    engine.generate(first, PARAMS).result()
    second = first[:20] + prompt_ids(21, seed=3)[1:]
    assert engine.generate(second, PARAMS).result().metrics.prefix_reused == 16
    assert _positions(engine, 0) == [16, 32]
    third = second[:35] + prompt_ids(9, seed=4)[1:]
    got = engine.generate(third, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, third)
    assert got.metrics.prefix_reused == 32
    engine.close()


def test_an_evicted_slots_snapshots_are_never_restored(family, hf_model, bundle):
    """A second prompt sharing only 10 tokens with the one slot's evicts it and is
    prefilled from 0; a third sharing 35 with the second gets the second's states."""
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=16, kv_slots=1)
    head = prompt_ids(10)
    engine.generate(head + prompt_ids(31, seed=2)[1:], PARAMS).result()
    second = head + prompt_ids(31, seed=3)[1:]
    assert engine.generate(second, PARAMS).result().metrics.prefix_reused == 0
    third = second[:35] + prompt_ids(9, seed=4)[1:]
    got = engine.generate(third, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, third)
    assert got.metrics.prefix_reused == 32
    engine.close()


def test_snapshots_move_with_their_slot_when_decode_rows_are_compacted(family, hf_model,
                                                                       bundle):
    hf_dir = hf_model(family)
    engine = _load(bundle, family, chunk_size=16, kv_slots=3)
    engine.generate(prompt_ids(20, seed=9), PARAMS).result()  # slot 0
    first = prompt_ids(40)
    engine.generate(first, PARAMS).result()  # slot 1
    assert engine.kv.compact([0, 2]) == {2: 1, 1: 2}  # the backend swapped their states
    assert _positions(engine, 2) == [16, 32] and _positions(engine, 1) == []
    second = first[:38] + prompt_ids(9, seed=4)[1:]
    got = engine.generate(second, PARAMS).result()  # into slot 1, lent by slot 2
    assert got.token_ids == reference_greedy(hf_dir, second)
    assert got.metrics.prefix_reused == 32
    engine.kv.check_integrity()
    engine.close()


def test_a_kv_budget_holds_each_slots_snapshots_too(family, bundle):
    """kv_budget_bytes is divided by a slot's KV and state and the most its snapshots may
    take: memory on the device stays within what was asked for."""
    engine = Engine.load(bundle(family), threads=2, background=False, max_context=512)
    backend, kv = engine.backend, engine.kv
    snapshots = snapshot_budget(backend, 512, 16)
    assert kv.max_snapshots * backend.state_bytes() <= snapshots
    engine.close()
    per_slot = backend.kv_slot_bytes(512) + snapshots
    engine = Engine.load(bundle(family), threads=2, background=False, max_context=512,
                         kv_budget_bytes=3 * per_slot + 1)
    assert len(engine.kv.slots) == 3
    engine.close()
