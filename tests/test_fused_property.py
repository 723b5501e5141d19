"""Property-based: whatever requests arrive, when, how long, with what priority, chunk size,
n or cancellation, an engine that fuses its steps generates exactly what one that never
fuses generates, and its KV bookkeeping stays whole. The fake backend's next token is a
function of the row's whole history in its slot (tests/fake_backend.py), so a token written
to the wrong slot or position changes what follows."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgeprefill import engines  # noqa: E402
from edgeprefill.sdk import Engine, GenerationParams  # noqa: E402
from tests.fake_backend import ids  # noqa: E402

request = st.fixed_dictionaries({
    "length": st.integers(1, 150),
    "new": st.integers(1, 30),
    "at": st.integers(0, 12),  # submitted before this step
    "priority": st.integers(-1, 1),
    "chunk": st.sampled_from([None, 1, 16, 64]),
    "n": st.integers(1, 2),
    "cancel": st.one_of(st.none(), st.integers(1, 20)),  # cancelled this many steps later
})


def run(bundle, backend: str, plan: list[dict], policy: str, slots: int,
        prefill_rows: int | None = None) -> list:
    engine = Engine.load(bundle, backend=backend, background=False, kv_slots=slots,
                         policy=policy, max_context=192, prefill_rows=prefill_rows)
    streams: dict[int, list] = {}
    step = 0
    while len(streams) < len(plan) or not all(
            s.metrics.finish_reason for group in streams.values() for s in group):
        for i, r in enumerate(plan):
            if r["at"] == step and i not in streams:
                streams[i] = engine.submit_n(
                    ids(r["length"], seed=i), GenerationParams(max_new_tokens=r["new"]),
                    r["n"], r["priority"], None, r["chunk"])
            if r["cancel"] is not None and r["at"] + r["cancel"] == step and i in streams:
                for s in streams[i]:
                    s.cancel()
        engine.step()
        step += 1
        assert step < 5000, "the engine stopped making progress"
        engine.check_integrity()
    out = [[(s.result().token_ids, s.result().finish_reason) for s in streams[i]]
           for i in range(len(plan))]
    fused = sum(c.kind == "fused" for c in engine.backend.calls)
    engine.close()
    return [out, fused]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(request, min_size=1, max_size=6),
       policy=st.sampled_from(["chunked+priority", "chunked", "fcfs"]),
       slots=st.integers(1, 4))
def test_fusing_never_changes_what_is_generated(bundle, monkeypatch, plan, policy, slots):
    monkeypatch.setitem(engines.BACKENDS, "fake", "tests.fake_backend:FakeBackend")
    monkeypatch.setitem(engines.BACKENDS, "fake-fusing", "tests.fake_backend:FusingFakeBackend")
    # No prompt may outgrow a slot: the fake model's context is 192 positions.
    plan = [dict(r, length=min(r["length"], 192 - r["new"])) for r in plan]
    # (Over these 60 examples about a third run fused calls; the rest have no prefill
    # beside a decode, or no room for one.)
    # One prompt a step, as where steps do not fuse: then both engines take the same steps,
    # so a cancel `cancel` steps later meets both at the same point.
    fused, _ = run(bundle("llama"), "fake-fusing", plan, policy, slots, prefill_rows=1)
    alone, calls = run(bundle("llama"), "fake", plan, policy, slots)
    assert calls == 0
    assert fused == alone


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(request.map(lambda r: dict(r, cancel=None)), min_size=1, max_size=6),
       policy=st.sampled_from(["chunked+priority", "chunked"]),
       slots=st.integers(1, 4))
def test_shared_prefill_steps_never_change_what_is_generated(bundle, monkeypatch, plan,
                                                              policy, slots):
    """Several prompts' chunks in one step (the default where steps fuse) against one
    prompt a step: the same tokens and finish reasons. Shared steps finish prompts in fewer
    steps, so no plan here cancels after a count of steps (a cancel would then meet the
    two engines at different points: test_fusing_never_changes_what_is_generated keeps
    those, one prompt a step)."""
    monkeypatch.setitem(engines.BACKENDS, "fake-fusing", "tests.fake_backend:FusingFakeBackend")
    plan = [dict(r, length=min(r["length"], 192 - r["new"])) for r in plan]
    shared, _ = run(bundle("llama"), "fake-fusing", plan, policy, slots)
    one, _ = run(bundle("llama"), "fake-fusing", plan, policy, slots, prefill_rows=1)
    assert shared == one
