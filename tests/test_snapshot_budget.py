"""The KV cache's state snapshots on a fake backend: their budget, their period, what is
dropped with a slot, and that an attention-only model keeps none (kv_cache.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeprefill.engines.base import BackendOptions, StepBatch
from edgeprefill.errors import BackendError
from edgeprefill.sdk import GenerationParams
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.state_snapshots import snapshot_budget
from tests.fake_backend import StatefulFakeBackend, fake_backend, fake_manifest, ids, state_hash


def _stateful_cache(slots: int = 2, max_snapshots: int | None = None) -> KVCache:
    backend = StatefulFakeBackend(Path("."), fake_manifest(), BackendOptions())
    kv = KVCache(backend, slots=slots, capacity=512, align=16)
    if max_snapshots is not None:
        kv.max_snapshots = max_snapshots
    return kv


def _prefill(kv: KVCache, slot: int, tokens: list[int], start: int, end: int) -> None:
    """Chunks of 16 from `start` to `end`, each cut where the cache keeps a snapshot."""
    while start < end:
        stop = kv.chunk_end(slot, start, min(start + 16, end), finishes=False)
        part = tokens[start:stop]
        kv.backend.run(StepBatch(np.array([part]), np.array([start], np.int32),
                                 np.array([len(part)], np.int32), slot))
        kv.extend(slot, part)
        start = stop


def test_over_budget_the_period_doubles_and_the_snapshots_stay_spread():
    kv = _stateful_cache(max_snapshots=3)
    tokens = ids(200)
    slot = kv.acquire(tokens, None).slot
    _prefill(kv, slot, tokens, 0, 96)
    assert [s.position for s in kv.slots[slot].snapshots] == [32, 64, 96]
    # The next chunk crossing a multiple of the new period ends there.
    assert kv.chunk_end(slot, 96, 150, finishes=False) == 128
    assert kv.chunk_end(slot, 96, 120, finishes=False) == 120
    assert kv.chunk_end(slot, 96, 150, finishes=True) == 150  # no call added
    kv.release(slot, keep=True)
    # A prompt sharing 70 tokens gets 64 of them and the states there.
    other = tokens[:70] + ids(30, seed=1)
    got = kv.acquire(other, None)
    assert (got.reused, got.copied_from) == (64, slot)
    assert kv.backend.state[got.slot] == state_hash(0, tokens[:64])
    kv.check_integrity()


def test_a_freed_slot_drops_its_snapshots_and_period():
    kv = _stateful_cache(max_snapshots=1)
    tokens = ids(100)
    slot = kv.acquire(tokens, None).slot
    _prefill(kv, slot, tokens, 0, 64)
    assert kv.slots[slot].every == 64
    kv.release(slot, keep=False)
    assert kv.slots[slot].snapshots == [] and kv.slots[slot].every == 16
    kv.check_integrity()


def test_the_budget_is_half_a_slot_and_at_most_one_snapshot_every_align_positions():
    backend = StatefulFakeBackend(Path("."), fake_manifest(), BackendOptions())
    slot_bytes = backend.kv_slot_bytes(512)  # 32 KB of KV per 512 positions, 8 of state
    assert snapshot_budget(backend, 512, 16) == min(slot_bytes // 2, 32 * 8) == 256
    assert KVCache(backend, slots=1, capacity=512, align=16).max_snapshots == 32


def test_an_attention_only_model_keeps_no_snapshot_and_cuts_no_chunk():
    backend = fake_backend()
    assert snapshot_budget(backend, 512, 16) == 0
    kv = KVCache(backend, slots=1, capacity=512, align=16)
    tokens = ids(100)
    slot = kv.acquire(tokens, None).slot
    assert kv.chunk_end(slot, 0, 40, finishes=False) == 40
    _prefill(kv, slot, tokens, 0, 64)  # the fake's save_state would raise
    assert kv.slots[slot].snapshots == []
    with pytest.raises(BackendError, match="keeps no recurrent state"):
        backend.save_state(slot)


def _greedy(prompt: list[int], new: int, vocab: int) -> list[int]:
    """What StatefulFakeBackend generates for `prompt` from an empty cache."""
    state, out = state_hash(0, prompt), []
    for _ in range(new):
        out.append(3 + state % (vocab - 3))
        state = state_hash(state, out[-1:])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_interleaved_requests_sharing_prefixes_get_their_own_states(fake_engine, monkeypatch,
                                                                    seed):
    """Requests on a few shared prefixes, n > 1 choices, preemption, evictions and moved
    slots, on a cache of 3 slots (few snapshots a slot in half the runs): every reply is
    what its prompt alone gives."""
    from edgeprefill import engines

    monkeypatch.setitem(engines.BACKENDS, "fake-stateful",
                        "tests.fake_backend:StatefulFakeBackend")
    engine = fake_engine(backend="fake-stateful", kv_slots=3, background=False)
    if seed % 2:
        engine.kv.max_snapshots = 2
    vocab = engine.manifest.model.vocab_size
    rng = np.random.default_rng(seed)
    bases = [ids(60, seed=seed * 10 + i) for i in range(3)]
    streams = []
    for i in range(12):
        base = bases[rng.integers(len(bases))]
        prompt = base[: rng.integers(10, 60)] + ids(int(rng.integers(1, 30)), seed=100 + i)
        params = GenerationParams(max_new_tokens=int(rng.integers(1, 20)), ignore_eos=True)
        n = int(rng.integers(1, 3))
        chunk = int(rng.choice([16, 24, 64]))
        got = engine.submit_n(prompt, params, n, priority=int(rng.integers(0, 3)),
                              chunk_size=chunk)
        streams += [(prompt, params.max_new_tokens, s) for s in got]
        if rng.random() < 0.5:  # let some finish before the next arrive
            got[0].result()
    for prompt, new, stream in streams:
        assert stream.result().token_ids == _greedy(prompt, new, vocab)
    assert engine.kv.prefix_hits > 0
    engine.kv.check_integrity()
