"""Scheduling order, checked on a fake backend that records every engine call."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, EngineConfig, GenerationParams, SchedulerConfig
from tests.fake_backend import ids

LONG = 300


@pytest.fixture
def make_engine(fake_engine):
    return lambda **options: fake_engine(**{"kv_slots": 4, "background": False, **options})



def run_until(engine: Engine, condition, limit: int = 10_000) -> None:
    for _ in range(limit):
        if condition():
            return
        engine.step()
    raise AssertionError("condition never met")


def decoding(stream) -> bool:
    return stream.metrics.generated_tokens > 0


def test_long_prompt_is_chunked_between_decode_steps_of_running_sessions(make_engine):
    engine = make_engine(policy="chunked", chunk_size=64)
    chat = engine.generate(ids(10), GenerationParams(max_new_tokens=50))
    run_until(engine, lambda: decoding(chat))
    engine.backend.calls.clear()
    doc = engine.generate(ids(LONG, 1), GenerationParams(max_new_tokens=2))
    run_until(engine, lambda: decoding(doc))
    kinds = [c.kind for c in engine.backend.calls]
    prefills = engine.backend.prefills()
    assert [c.chunk for c in prefills] == [64, 64, 64, 64, 44]
    assert [c.past_lens[0] for c in prefills] == [0, 64, 128, 192, 256]
    # Every prefill chunk is followed by a decode step of the running chat before the next.
    for i, kind in enumerate(kinds[:-1]):
        if kind == "prefill":
            assert kinds[i + 1] == "decode", kinds
    assert chat.metrics.generated_tokens > 5  # the chat kept streaming meanwhile


def test_fcfs_prefills_the_whole_prompt_in_one_call(make_engine):
    engine = make_engine(policy="fcfs")
    stream = engine.generate(ids(LONG), GenerationParams(max_new_tokens=2))
    stream.result()
    assert [c.chunk for c in engine.backend.prefills()] == [LONG]


def urgent_during_a_long_prefill(engine: Engine):
    """A long prompt at priority 0; after its second chunk a short one at -1 (higher) arrives.
    Runs until the urgent one decodes; returns both streams."""
    doc = engine.generate(ids(LONG), GenerationParams(max_new_tokens=2), priority=0)
    run_until(engine, lambda: len(engine.backend.prefills()) == 2)
    urgent = engine.generate(ids(40, 5), GenerationParams(max_new_tokens=2), priority=-1)
    run_until(engine, lambda: decoding(urgent))
    return doc, urgent


def test_high_priority_arrival_is_served_before_the_rest_of_a_long_prefill(make_engine):
    engine = make_engine(policy="chunked+priority", chunk_size=32)
    doc, _ = urgent_during_a_long_prefill(engine)
    assert not decoding(doc)
    prefills = engine.backend.prefills()
    slots = [c.first_slot for c in prefills]
    doc_slot, urgent_slot = slots[0], slots[-1]
    assert urgent_slot != doc_slot
    assert slots == [doc_slot, doc_slot, urgent_slot, urgent_slot]  # 40 tokens: 32 + 8
    doc.result()
    # The preempted prompt resumed where it stopped: no chunk was recomputed.
    doc_chunks = [c for c in engine.backend.prefills() if c.first_slot == doc_slot]
    assert [c.past_lens[0] for c in doc_chunks] == list(range(0, LONG, 32))


def test_chunked_policy_does_not_preempt(make_engine):
    engine = make_engine(policy="chunked", chunk_size=32)
    doc, _ = urgent_during_a_long_prefill(engine)
    assert decoding(doc)  # the whole document went first


def test_decode_calls_carry_all_running_sessions_in_one_call(make_engine):
    engine = make_engine(policy="chunked", chunk_size=64)
    streams = [engine.generate(ids(20 + i, i), GenerationParams(max_new_tokens=30))
               for i in range(3)]
    run_until(engine, lambda: all(decoding(s) for s in streams))
    engine.backend.calls.clear()
    for _ in range(10):
        engine.step()
    calls = engine.backend.calls
    assert len(calls) == 10 and all(c.kind == "decode" and c.rows == 3 for c in calls)


def test_decode_rows_stay_adjacent_after_a_session_in_the_middle_finishes(make_engine):
    engine = make_engine(policy="chunked", chunk_size=64)
    lengths = [40, 5, 40]  # the session in slot 1 ends first
    streams = [engine.generate(ids(20, i), GenerationParams(max_new_tokens=n))
               for i, n in enumerate(lengths)]
    alone = []
    for i, n in enumerate(lengths):
        other = make_engine(policy="chunked", chunk_size=64)
        alone.append(other.generate(ids(20, i), GenerationParams(max_new_tokens=n)).result())
    results = [s.result() for s in streams]
    assert [r.token_ids for r in results] == [a.token_ids for a in alone]
    decodes = [c for c in engine.backend.calls if c.kind == "decode"]
    pairs = [c for c in decodes if c.rows == 2]
    assert len(pairs) > 30 and all(c.first_slot == 0 for c in pairs)  # slot 2 moved to 1
    assert all(c.rows != 3 for c in decodes[len(decodes) - len(pairs) - 1:])
    engine.check_integrity()


@pytest.mark.parametrize("moment", ["queued", "mid-prefill", "mid-decode"])
def test_cancelled_requests_leave_nothing_allocated(make_engine, moment):
    engine = make_engine(policy="chunked", chunk_size=32, kv_slots=1)
    blocker = engine.generate(ids(20), GenerationParams(max_new_tokens=5))
    target = engine.generate(ids(LONG, 3), GenerationParams(max_new_tokens=20))
    if moment == "queued":
        engine.step()  # the blocker holds the only slot: the target waits
    else:
        blocker.result()
        if moment == "mid-prefill":
            run_until(engine, lambda: target.metrics.chunks >= 2)
        else:
            run_until(engine, lambda: target.metrics.generated_tokens >= 3)
    target.cancel()
    engine.step()
    assert target.result().finish_reason == "cancelled"
    blocker.result()
    engine.check_integrity()
    usage = engine.kv.usage()
    assert usage.active == 0
    # The cancelled request's KV was freed, not kept for reuse.
    assert all(len(slot.tokens) != LONG for slot in engine.kv.slots)


def test_requests_that_can_never_fit_are_rejected_at_once(make_engine):
    engine = make_engine()
    with pytest.raises(RequestError, match="exceeds the context"):
        engine.generate(ids(500), GenerationParams(max_new_tokens=100))
    with pytest.raises(RequestError, match="empty"):
        engine.generate([], GenerationParams())


def test_a_request_waits_for_a_slot_then_runs(make_engine):
    engine = make_engine(kv_slots=1, chunk_size=64)
    first = engine.generate(ids(20), GenerationParams(max_new_tokens=10))
    second = engine.generate(ids(20, 1), GenerationParams(max_new_tokens=10))
    engine.step()
    assert engine.metrics().queue_depth == 1
    assert engine.metrics().running == 1  # the queued request is not counted as running
    assert first.result().finish_reason == "length"
    assert second.result().finish_reason == "length"
    # The second request got the slot only once the first had finished with it.
    assert second.metrics.scheduled >= first.metrics.token_times[-1]


def test_running_out_of_context_ends_with_length(make_engine):
    engine = make_engine(max_context=64)
    stream = engine.generate(ids(50), GenerationParams(max_new_tokens=None)).result()
    assert stream.finish_reason == "length"
    # prompt + reply fill the context, as submit counts it (max_new_tokens=14 runs too)
    assert len(stream.token_ids) == 64 - 50
    engine.generate(ids(50), GenerationParams(max_new_tokens=64 - 50)).result()
    with pytest.raises(RequestError, match="exceeds the context of 64"):
        engine.generate(ids(50), GenerationParams(max_new_tokens=64 - 50 + 1))


def test_prefix_reuse_is_chunk_aligned_and_verified_by_content(make_engine):
    engine = make_engine(chunk_size=64)
    shared = ids(40)
    engine.generate(shared + ids(10, 1), GenerationParams(max_new_tokens=2)).result()
    second = engine.generate(shared + ids(10, 2), GenerationParams(max_new_tokens=2))
    second.result()
    assert second.metrics.prefix_reused == 32  # 40 shared tokens, aligned down to 16
    assert engine.backend.prefills()[-1].past_lens == (32,)
    # Same length, different content: nothing is reused.
    third = engine.generate(ids(50, 9), GenerationParams(max_new_tokens=2)).result()
    assert third.metrics.prefix_reused == 0
    # Output equals a cold run of the same prompt.
    cold = make_engine(chunk_size=64, prefix_reuse=False)
    again = cold.generate(shared + ids(10, 2), GenerationParams(max_new_tokens=2)).result()
    assert again.token_ids == second.token_ids


def test_prefix_cache_evicts_least_recently_used(make_engine):
    engine = make_engine(kv_slots=2, chunk_size=64)
    prompts = [ids(40, s) for s in range(3)]
    for p in prompts:
        engine.generate(p, GenerationParams(max_new_tokens=2)).result()
    held = [slot.tokens[:40] for slot in engine.kv.slots]
    assert prompts[0] not in held and prompts[1] in held and prompts[2] in held


def test_session_keeps_its_kv_between_turns(make_engine):
    engine = make_engine(chunk_size=64)
    session = engine.session()
    first = session.generate(ids(30), GenerationParams(max_new_tokens=5)).result()
    second = session.generate(ids(10, 1), GenerationParams(max_new_tokens=5)).result()
    # Everything but the first reply's last token (never fed back) was in the cache.
    assert second.metrics.prefix_reused == 30 + 5 - 1
    assert second.metrics.prompt_tokens == 30 + 5 + 10
    fresh = make_engine(chunk_size=64, prefix_reuse=False)
    conversation = ids(30) + first.token_ids + ids(10, 1)
    assert fresh.generate(conversation, GenerationParams(max_new_tokens=5)).result(
    ).token_ids == second.token_ids


def test_adaptive_chunking_picks_smaller_chunks_while_sessions_decode(make_engine):
    engine = make_engine(policy="chunked+priority", chunk_size=None)
    solo = engine.generate(ids(LONG), GenerationParams(max_new_tokens=2)).result()
    assert solo.metrics.chunks == -(-LONG // 64)  # nobody decoding: the largest bucket
    controller = engine.scheduler.chunks
    controller.per_token = {16: 0.001, 64: 0.001}  # 1 ms per token
    controller.decode_s = 0.01
    controller.target = 0.05  # 40 ms left for a chunk: 16 fits, 64 does not
    assert controller.choose(decoding=True) == 16
    assert controller.choose(decoding=False) == 64


def test_a_kv_cache_that_cannot_be_allocated_is_a_request_error(fake_engine, monkeypatch):
    from tests.fake_backend import FakeBackend

    def no_memory(self, slots, capacity):
        raise MemoryError

    monkeypatch.setattr(FakeBackend, "allocate_kv", no_memory)
    with pytest.raises(RequestError, match="KV slots of .* could not be allocated; lower"):
        fake_engine(kv_slots=3)


def test_a_chunk_size_under_fcfs_is_refused_not_ignored():
    from edgeprefill.sdk.scheduler import SchedulerConfig

    with pytest.raises(RequestError, match="does not apply to the fcfs policy"):
        SchedulerConfig(policy="fcfs", chunk_size=16)


@pytest.mark.parametrize("option, value", [("kv_slots", "4"), ("threads", 1.5),
                                           ("max_context", True)])
def test_engine_options_of_the_wrong_type_are_one_line(option, value):
    from edgeprefill.sdk.config import EngineConfig

    with pytest.raises(RequestError, match=f"{option} must be an integer, got {value!r}"):
        EngineConfig(**{option: value})


def test_more_threads_than_cpus_warns(bundle, caplog):
    import os

    from edgeprefill.sdk import Engine

    many = len(os.sched_getaffinity(0)) + 2
    with Engine.load(bundle("llama"), threads=many, warm_up=False):
        pass
    assert f"{many} compute threads on" in caplog.text


@pytest.mark.parametrize("option, values", [
    ("spin", "True, False or None"),  # None: EDGEPREFILL_SPIN's default
    ("warm_up", "True or False"), ("prefix_reuse", "True or False"),
])
def test_boolean_engine_options_refuse_strings(option, values):
    from edgeprefill.sdk.config import EngineConfig

    with pytest.raises(RequestError, match=f"^{option} must be {values}, got 'no'$"):
        EngineConfig(**{option: "no"})


@pytest.mark.parametrize("make, message", [
    (lambda: GenerationParams(top_pp=0.5),
     "GenerationParams has no field 'top_pp' (did you mean 'top_p'?); its fields: "
     "max_new_tokens, temperature, top_k, top_p, "),
    (lambda: GenerationParams(unknown=1, other=2),
     "GenerationParams has no fields 'unknown', 'other'; its fields: max_new_tokens, "),
    (lambda: replace(GenerationParams(), tempreature=1.0),
     "GenerationParams has no field 'tempreature' (did you mean 'temperature'?)"),
    (lambda: SchedulerConfig(polcy="fcfs"),
     "SchedulerConfig has no field 'polcy' (did you mean 'policy'?); its fields: policy, "),
    (lambda: EngineConfig(thread=2),
     "EngineConfig has no field 'thread' (did you mean 'threads'?); its fields: backend, "),
    (lambda: Engine.load("no-bundle", kv_slot=2),  # before the bundle is even looked at
     "Engine.load has no option 'kv_slot' (did you mean 'kv_slots'?); its options: "),
])
def test_an_unknown_keyword_of_a_frozen_config_names_it_and_the_valid_ones(make, message):
    # It used to be Python's TypeError from the dataclass's __init__, naming no valid field.
    with pytest.raises(RequestError) as refused:
        make()
    assert str(refused.value).startswith(message), str(refused.value)


def test_params_given_as_a_dict_are_one_line_saying_what_to_pass(make_engine):
    # It was an AttributeError from deep inside submit ('dict' has no 'fit_context').
    engine = make_engine(background=False)
    with pytest.raises(RequestError, match=r"^params must be a GenerationParams, got dict "
                                           r"\(GenerationParams\(\*\*fields\) makes one\)$"):
        engine.submit(ids(3), {"max_new_tokens": 3}, 0, None)


def test_the_scheduler_is_configured_by_its_fields_not_an_object(bundle):
    from edgeprefill.sdk import Engine

    with pytest.raises(RequestError, match="not scheduler="):
        Engine.load(bundle("llama"), scheduler=None)


def test_an_n_sibling_waiting_for_a_slot_copies_its_prompt_before_shorter_requests(
        make_engine):
    """One slot busy, one for the n = 2 request: its second choice waits. Scored by its
    prompt's length, it let the short requests that came later take the slot, which
    evicted the prompt's KV; it prefilled the prompt a second time."""
    engine = make_engine(kv_slots=2, chunk_size=64)
    busy = engine.generate(ids(10), GenerationParams(max_new_tokens=400, ignore_eos=True))
    run_until(engine, lambda: decoding(busy))
    choices = engine.submit_n(ids(LONG, 1), GenerationParams(max_new_tokens=3,
                                                            ignore_eos=True), 2)
    run_until(engine, lambda: decoding(choices[0]))
    shorts = [engine.generate(ids(20, 2 + k), GenerationParams(max_new_tokens=2))
              for k in range(3)]
    run_until(engine, lambda: all(s.done for s in [*choices, *shorts]))
    # The sibling's prefill is its prompt's last token (the KV before it copied).
    assert engine.metrics().prefill_tokens == 10 + LONG + 1 + 3 * 20
    assert choices[1].metrics.prefix_reused == LONG - 1
    busy.cancel()
