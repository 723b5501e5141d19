"""What every reader of a stream can rely on (docs/design.md, "What a stream promises"):
close() ends every stream, leaving a loop cancels, two readers never hang, bad ids are
refused at submit. Run on the fake backend, so only the engine's logic is under test."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from edgeprefill.errors import EngineClosedError, RequestError
from edgeprefill.sdk import GenerationParams
from tests.fake_backend import ids

HANG = 10  # seconds after which a reader counts as blocked forever
MANY = GenerationParams(max_new_tokens=300, ignore_eos=True)


@pytest.fixture
def make_engine(fake_engine):
    return lambda **options: fake_engine(**{"kv_slots": 2, "chunk_size": 16, **options})



def finish_within(stream, seconds: float = HANG) -> str | None:
    """The stream's finish reason once a reader thread reaches its end; None if the
    reader is still blocked after `seconds`."""
    reader = threading.Thread(target=stream.result, daemon=True)
    reader.start()
    reader.join(seconds)
    return None if reader.is_alive() else stream.finish_reason


def test_close_ends_queued_prefilling_decoding_and_just_submitted_streams(make_engine):
    engine = make_engine(background=False, kv_slots=1)
    decoding = engine.generate(ids(20), MANY)
    while decoding.metrics.generated_tokens == 0:
        engine.step()
    queued = engine.generate(ids(150, 1), MANY)  # the only slot is busy
    engine.step()
    just_submitted = engine.generate(ids(30, 2), MANY)  # still in the inbox
    engine.close()
    for stream in (decoding, queued, just_submitted):
        assert finish_within(stream) == "cancelled"
    assert engine.kv.usage().active == 0
    with pytest.raises(EngineClosedError):
        engine.generate(ids(5), MANY)
    engine.close()  # a second close is harmless


def test_close_racing_with_submitting_threads_leaves_no_stream_open(make_engine):
    engine = make_engine(kv_slots=2)
    streams, refused = [], []
    submitting = threading.Event()  # close once submissions are under way, not before

    def submit_many(seed: int) -> None:
        for i in range(50):
            try:
                streams.append(engine.generate(ids(20, seed * 100 + i), MANY))
                submitting.set()
            except EngineClosedError:
                refused.append(i)

    threads = [threading.Thread(target=submit_many, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    assert submitting.wait(30)
    engine.close()
    for t in threads:
        t.join()
    assert streams and all(finish_within(s) is not None for s in streams)


def test_breaking_out_of_a_for_loop_cancels_the_request_and_frees_its_slot(make_engine):
    engine = make_engine(background=False)
    stream = engine.generate(ids(20), MANY)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    engine.step()  # the cancellation takes effect at the next step boundary
    assert stream.done and stream.finish_reason == "cancelled"
    assert len(stream.token_ids) < 10
    assert engine.kv.usage().active == 0
    engine.check_integrity()


def test_an_exception_inside_the_loop_cancels_the_request(make_engine):
    engine = make_engine(background=False)
    stream = engine.generate(ids(20), MANY)
    with pytest.raises(KeyError):
        for _ in stream:
            raise KeyError("the caller's own bug")
    engine.step()
    assert stream.finish_reason == "cancelled"
    assert engine.kv.usage().active == 0


def test_leaving_an_async_for_loop_cancels_the_request(make_engine):
    # No loop thread: the reader's own pumping produces the tokens, so the request cannot
    # run to its end before the break, however slow the machine.
    engine = make_engine(background=False)

    async def read_three(stream) -> None:
        count = 0
        async for _ in stream:
            count += 1
            if count == 3:
                break

    stream = engine.generate(ids(20), MANY)
    asyncio.run(read_three(stream))
    assert finish_within(stream) == "cancelled"
    assert len(stream.token_ids) < MANY.max_new_tokens


def test_a_finished_stream_iterates_as_empty(make_engine):
    engine = make_engine(background=False)
    stream = engine.generate(ids(20), GenerationParams(max_new_tokens=4, ignore_eos=True))
    assert len(list(stream)) == 4
    assert list(stream) == [] and stream.finish_reason == "length"


@pytest.mark.parametrize("background", [True, False])
def test_two_threads_reading_one_stream_both_end_and_share_its_events(make_engine,
                                                                      background):
    engine = make_engine(background=background)
    stream = engine.generate(ids(20), GenerationParams(max_new_tokens=200, ignore_eos=True))
    seen: list[list[int]] = [[], []]

    def read(into: list[int]) -> None:
        into.extend(e.token_id for e in stream if e.token_id is not None)

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in seen]
    for r in readers:
        r.start()
    for r in readers:
        r.join(HANG)
    assert not any(r.is_alive() for r in readers), "a reader is blocked"
    assert stream.finish_reason == "length"
    # Each event went to exactly one reader; the stream's record holds them all, in order.
    assert sorted(seen[0] + seen[1]) == sorted(stream.token_ids)
    assert len(stream.token_ids) == 200


@pytest.mark.parametrize("bad", [-1, 128, 10**9, 3.0, True])
def test_submit_refuses_token_ids_outside_the_vocabulary(make_engine, bad):
    engine = make_engine(background=False)
    with pytest.raises(RequestError, match=r"not in the vocabulary \(ids 0\.\.127\)"):
        engine.submit([5, bad, 6], None, 0, None)
    assert engine.scheduler.live() == []


def test_a_failing_kv_swap_ends_the_requests_with_an_error_not_the_loop(make_engine,
                                                                        monkeypatch):
    engine = make_engine(background=False, kv_slots=3)
    params = [GenerationParams(max_new_tokens=n, ignore_eos=True) for n in (200, 3, 200)]
    streams = [engine.generate(ids(20, s), p) for s, p in enumerate(params)]
    while not streams[1].done:  # the middle one ends: the next step swaps slot 2 into 1
        engine.step()

    def broken(*_args: object) -> None:
        raise RuntimeError("device copy failed")

    monkeypatch.setattr(engine.backend, "swap_kv", broken)
    engine.step()  # raises nothing: the loop would go on
    for stream in (streams[0], streams[2]):
        assert stream.result().finish_reason == "error"
        assert "device copy failed" in stream.error
    monkeypatch.undo()
    assert engine.generate(ids(20, 9), params[1]).result().finish_reason == "length"
    engine.check_integrity()


def test_close_ends_every_choice_of_an_n_request(make_engine):
    engine = make_engine(background=False, kv_slots=1)
    busy = engine.generate(ids(20), MANY)
    engine.step()  # the only slot is taken: the n request waits with its siblings
    choices = engine.submit_n(ids(30, 1), MANY, 3)
    engine.close()
    for stream in (busy, *choices):
        assert finish_within(stream) == "cancelled"


def test_the_choices_of_an_admitted_n_request_wait_past_the_queue_limit(make_engine):
    # One slot and a queue of one: the siblings cannot fork a slot and wait in the queue
    # one after another. Refusing them there would throw away a request half served.
    engine = make_engine(background=False, kv_slots=1, max_queue=1)
    choices = engine.submit_n(ids(30, 1), GenerationParams(max_new_tokens=4), 3)
    while not all(s.done for s in choices):
        engine.step()
    assert [s.finish_reason for s in choices] == ["length"] * 3
    engine.check_integrity()


def test_a_refused_n_request_takes_its_choices_with_it(make_engine):
    engine = make_engine(background=False, kv_slots=1, max_queue=1)
    running = engine.generate(ids(20), MANY)
    engine.step()  # takes the only slot
    waiting = engine.generate(ids(20, 1), MANY)
    engine.step()  # fills the queue
    refused = engine.submit_n(ids(30, 2), MANY, 3)
    engine.step()
    for stream in refused:
        assert stream.done and stream.finish_reason == "error"
        assert "the queue is full" in stream.error
    assert not running.done and not waiting.done
    engine.close()


def slow_steps(engine, seconds: float, monkeypatch) -> None:
    run = engine.backend.run

    def slow(step):
        time.sleep(seconds)
        return run(step)

    monkeypatch.setattr(engine.backend, "run", slow)


def test_an_async_read_that_times_out_takes_no_event(make_engine, monkeypatch):
    engine = make_engine()
    slow_steps(engine, 0.004, monkeypatch)
    stream = engine.generate(ids(20), GenerationParams(max_new_tokens=40, ignore_eos=True))

    async def read_with_short_timeouts() -> tuple[list[int], int]:
        events, timeouts = aiter(stream), 0
        got: list[int] = []
        while True:
            try:
                event = await asyncio.wait_for(anext(events), timeout=0.001)
            except asyncio.TimeoutError:
                timeouts += 1
                continue
            except StopAsyncIteration:
                return got, timeouts
            got.append(event.token_id)

    got, timeouts = asyncio.run(read_with_short_timeouts())
    assert timeouts > 0  # reads were cancelled mid-wait ...
    assert got == stream.token_ids and len(got) == 40  # ... and none took an event


def test_async_readers_hold_no_threads(make_engine, monkeypatch):
    # Forty readers of queued streams and one of the decoding stream: more than the
    # default executor's threads. The decoding stream's reader still gets its tokens as
    # they come, and the event loop's own thread pool stays free.
    engine = make_engine(kv_slots=1)
    slow_steps(engine, 0.002, monkeypatch)
    running = engine.generate(ids(20), GenerationParams(max_new_tokens=100, ignore_eos=True))
    queued = [engine.generate(ids(20, i + 1), GenerationParams(max_new_tokens=2))
              for i in range(40)]
    first_read: list[float] = []

    async def read(stream, note: bool) -> None:
        async for _ in stream:
            if note and not first_read:
                first_read.append(time.perf_counter())

    async def main() -> float:
        tasks = [asyncio.create_task(read(s, False)) for s in queued]
        tasks.append(asyncio.create_task(read(running, True)))
        await asyncio.sleep(0.05)
        began = time.perf_counter()
        await asyncio.to_thread(lambda: None)
        waited = time.perf_counter() - began
        await asyncio.gather(*tasks)
        return waited

    waited = asyncio.run(main())
    assert waited < 0.1
    assert first_read[0] < running.metrics.token_times[-1]  # read before the request ended
    assert all(s.finish_reason == "length" for s in [running, *queued])


def test_cancelling_the_first_choice_before_its_prefill_cancels_only_it(make_engine):
    engine = make_engine(background=False, kv_slots=1)
    busy = engine.generate(ids(20), GenerationParams(max_new_tokens=3))
    engine.step()  # the only slot is taken: the n request waits
    choices = engine.submit_n(ids(30, 1), GenerationParams(max_new_tokens=3), 3)
    choices[0].cancel()
    while not all(s.done for s in [busy, *choices]):
        engine.step()
    assert [s.finish_reason for s in choices] == ["cancelled", "length", "length"]


def test_a_closed_session_starts_a_new_conversation(make_engine):
    engine = make_engine(background=False)
    session = engine.session()
    session.generate(ids(10), GenerationParams(max_new_tokens=2)).result()
    session.close()
    again = session.generate(ids(5, 1), GenerationParams(max_new_tokens=2))
    assert again.metrics.prompt_tokens == 5  # not the old conversation plus 5
    with pytest.raises(RequestError, match="the turn is empty"):
        session.generate([])


@pytest.mark.parametrize("tokens", [np.array([5, 6, 7]), (t for t in [5, 6, 7]),
                                    [np.int64(5), np.int64(6)]])
def test_token_ids_come_as_any_sequence_of_integers(make_engine, tokens):
    engine = make_engine(background=False)
    stream = engine.submit(tokens, GenerationParams(max_new_tokens=2), 0, None)
    assert stream.result().finish_reason == "length"


@pytest.mark.parametrize("prompt, message", [(None, "a prompt is a string"),
                                             (123, "a prompt is a string")])
def test_a_prompt_of_the_wrong_type_is_one_line(make_engine, prompt, message):
    engine = make_engine(background=False)
    with pytest.raises(RequestError, match=message):
        engine.generate(prompt)


@pytest.mark.parametrize("chunk", [2.5, "16", True, 0])
def test_a_bad_chunk_size_is_refused_at_submit(make_engine, chunk):
    engine = make_engine(background=False)
    with pytest.raises(RequestError, match="chunk_size must be an integer >= 1"):
        engine.generate(ids(10), GenerationParams(max_new_tokens=2), chunk_size=chunk)


def test_a_final_eos_is_timed_but_neither_output_nor_an_inter_token_gap():
    from edgeprefill.sdk.metrics import RequestMetrics

    metrics = RequestMetrics(arrival=0.0, token_times=[1.0, 2.0, 4.0, 7.0], ended_on_eos=True)
    assert metrics.generated_tokens == 3
    assert metrics.inter_token_latencies == [1.0, 2.0]  # not the 3.0 to the EOS
    assert metrics.ttft == 1.0


def test_metrics_count_the_output_not_the_eos_and_idle_is_no_stall(make_engine, monkeypatch):
    engine = make_engine(background=False)
    stream = engine.generate(ids(10), GenerationParams(max_new_tokens=50))
    while not stream.done:
        engine.step()
    assert stream.metrics.generated_tokens == len(stream.token_ids)
    assert len(stream.metrics.inter_token_latencies) == len(stream.token_ids) - 1
    # Leaving a request by cancel, then idling: the next decode steps start no stall.
    first = engine.generate(ids(10, 1), GenerationParams(max_new_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    first.cancel()
    engine.step()
    time.sleep(0.3)
    later = engine.generate(ids(10, 2), GenerationParams(max_new_tokens=4, ignore_eos=True))
    while not later.done:
        engine.step()
    assert engine.metrics().max_decode_stall_s < 0.25


def test_a_request_without_params_fits_its_reply_to_the_context(make_engine):
    engine = make_engine(background=False)
    long_prompt = ids(engine.capacity - 10)
    stream = engine.generate(long_prompt)  # the default 256 new tokens do not fit
    while not stream.done:
        engine.step()
    assert stream.finish_reason in ("length", "stop")
    with pytest.raises(RequestError, match=r"max_new_tokens \(256\) exceeds the context"):
        engine.generate(long_prompt, engine.default_params(max_new_tokens=256))


def test_ttft_counts_from_the_generate_call_tokenizing_included(make_engine, monkeypatch):
    engine = make_engine(background=False)
    encode = engine.tokenizer.encode

    def slow_encode(prompt, **chat):
        time.sleep(0.05)
        return encode(prompt, **chat)

    monkeypatch.setattr(engine.tokenizer, "encode", slow_encode)
    stream = engine.generate("w5 w6", GenerationParams(max_new_tokens=1))
    while not stream.done:
        engine.step()
    assert stream.metrics.ttft >= 0.05


def test_an_engine_dropped_without_close_is_collected_and_its_thread_ends(bundle,
                                                                           monkeypatch):
    """Its loop thread held it for good, with its KV cache and backend session; now the
    thread holds it only during a step, and the collection warns as an open file does."""
    import gc
    import warnings
    import weakref

    from edgeprefill import engines
    from edgeprefill.sdk import Engine

    monkeypatch.setitem(engines.BACKENDS, "fake", "tests.fake_backend:FakeBackend")
    engine = Engine.load(bundle("llama"), backend="fake", warm_up=False, kv_slots=2)
    assert engine.generate(ids(20), GenerationParams(max_new_tokens=3)).result().token_ids
    thread, gone = engine._thread, weakref.ref(engine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del engine
        deadline = time.monotonic() + HANG
        while gone() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        thread.join(HANG)
    assert gone() is None and not thread.is_alive()
    assert any(issubclass(w.category, ResourceWarning) and "never closed" in str(w.message)
               for w in caught)


def test_a_closed_engine_does_not_warn_when_collected(make_engine):
    engine = make_engine()
    assert engine._unclosed.alive
    engine.close()
    assert not engine._unclosed.alive  # close() took the warning back


@pytest.mark.parametrize("backend", ["fake", "fake-fusing"])
def test_a_request_whose_sampler_fails_ends_alone(make_engine, backend):
    """A request's own failure in a step (its constraint, sampler or detokenizer) ended
    every request of that step: the decode rows beside it, and in a fused call the prompt
    being prefilled. Now only it ends, with its error; the others run to their length."""
    engine = make_engine(background=False, kv_slots=4, backend=backend)
    params = GenerationParams(max_new_tokens=12, ignore_eos=True)
    doomed, *others = [engine.generate(ids(9, seed), params) for seed in range(3)]
    while doomed.metrics.generated_tokens < 2:
        engine.step()
    request = next(r for r in engine.scheduler.live() if r.stream is doomed)

    def fail(logits):
        raise RuntimeError("the grammar broke")

    request.sampler.choose = fail
    others.append(engine.generate(ids(40, 7), params))  # prefilled beside the decode rows
    while not all(s.done for s in [doomed, *others]):
        engine.step()
    assert doomed.finish_reason == "error" and "the grammar broke" in doomed.error
    assert [s.finish_reason for s in others] == ["length"] * 3
    assert [len(s.token_ids) for s in others] == [12] * 3
    engine.check_integrity()
    assert engine.kv.usage().active == 0


def three_choices_beside_a_decode_row(make_engine, backend):
    """An engine decoding one request, and three choices of a 30-token prompt submitted
    beside it (prefilled in chunks of 8): (engine, neighbour, choices)."""
    engine = make_engine(background=False, kv_slots=6, backend=backend)
    params = GenerationParams(max_new_tokens=10, ignore_eos=True)
    neighbour = engine.generate(ids(9, 3), params)
    while neighbour.metrics.generated_tokens < 2:
        engine.step()
    return engine, neighbour, engine.submit_n(ids(30, 1), params, 3, chunk_size=8)


def only_the_second_choice_fails(engine, neighbour, choices, error: str) -> None:
    """Step until all end (a sibling lost with its step would never end): the second
    choice ends with `error`, the others with their 10 tokens."""
    for _ in range(100):
        if all(s.done for s in [neighbour, *choices]):
            break
        engine.step()
    assert choices[1].finish_reason == "error" and error in choices[1].error
    kept = [neighbour, choices[0], choices[2]]
    assert [s.finish_reason for s in kept] == ["length"] * 3
    assert [len(s.token_ids) for s in kept] == [10] * 3
    engine.check_integrity()
    assert engine.kv.usage().active == 0


@pytest.mark.parametrize("backend", ["fake", "fake-fusing"])
def test_a_choice_whose_first_token_fails_ends_alone(make_engine, backend):
    """The n > 1 siblings that fork from a prefilled prompt take their first token in the
    step that prefilled it. One sibling's failure there (its sampler, its detokenizer)
    ended every request of that step: the prompt's own first choice, its other siblings
    and the decode rows beside it. Now only that sibling ends, with its error."""
    engine, neighbour, choices = three_choices_beside_a_decode_row(make_engine, backend)
    engine.step()  # the first chunk of four: the siblings wait for the prompt
    leader = next(r for r in engine.scheduler.live() if r.stream is choices[0])

    def fail(logits):
        raise RuntimeError("the grammar broke")

    leader.followers[0].sampler.choose = fail
    only_the_second_choice_fails(engine, neighbour, choices, "the grammar broke")


@pytest.mark.parametrize("backend", ["fake", "fake-fusing"])
def test_a_choice_whose_kv_copy_fails_ends_alone(make_engine, backend):
    """A sibling's copy of its prompt's KV (KVCache.fork) failing in the backend ended
    every request of the step; now that sibling alone ends, with the error, and its slot
    stays free for the others."""
    engine, neighbour, choices = three_choices_beside_a_decode_row(make_engine, backend)
    copy_kv, copies = engine.backend.copy_kv, []

    def first_copy_fails(source, target, length):
        copies.append(target)
        if len(copies) == 1:
            raise RuntimeError("out of device memory")
        copy_kv(source, target, length)

    engine.backend.copy_kv = first_copy_fails
    only_the_second_choice_fails(engine, neighbour, choices, "out of device memory")
    assert len(copies) == 2  # both siblings forked, the first's copy failed
