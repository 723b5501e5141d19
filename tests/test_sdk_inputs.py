"""The public SDK refuses a wrong argument at the call, in one line that names it (a
RequestError, or the documented BundleError), and never takes it silently: the cases a
pass over the API with wrong types and values found (Engine.load's options, prompts,
embedding and rerank texts, n). Run on the fake backend where only the engine's logic is
under test."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.errors import BundleError, RequestError
from edgeprefill.sdk import Engine, EngineConfig, GenerationParams, SchedulerConfig


def refused(make, message: str, field: str | None = None) -> RequestError:
    with pytest.raises(RequestError) as caught:
        make()
    err = caught.value
    assert str(err) == message and "\n" not in str(err)
    assert err.field == field
    return err


@pytest.mark.parametrize("field, value, message", [
    # each was Python's TypeError from a comparison ("'<' not supported between ...")
    ("chunk_size", "16", "chunk_size must be an integer >= 1, got '16'"),
    ("max_step_tokens", None, "max_step_tokens must be an integer >= 1, got None"),
    ("max_queue", "x", "max_queue must be an integer >= 1, got 'x'"),
    ("aging_tokens", None, "aging_tokens must be an integer >= 0, got None"),
    ("itl_target_ms", "5", "itl_target_ms must be a finite number > 0, got '5'"),
    # each was taken: a fractional chunk or queue, True as 1, no ITL target at all
    ("chunk_size", 1.5, "chunk_size must be an integer >= 1, got 1.5"),
    ("chunk_size", True, "chunk_size must be an integer >= 1, got True"),
    ("max_queue", 2.5, "max_queue must be an integer >= 1, got 2.5"),
    ("aging_tokens", 1.5, "aging_tokens must be an integer >= 0, got 1.5"),
    ("itl_target_ms", float("inf"), "itl_target_ms must be a finite number > 0, got inf"),
    ("itl_target_ms", True, "itl_target_ms must be a finite number > 0, got True"),
    ("fuse_steps", "no", "fuse_steps must be True, False or None, got 'no'"),
    # already refused, now naming the field as the CLI renders it (--chunk-size)
    ("chunk_size", 0, "chunk_size must be an integer >= 1, got 0"),
    ("itl_target_ms", 0, "itl_target_ms must be a finite number > 0, got 0"),
])
def test_the_scheduler_s_fields_are_typed_and_named(field, value, message):
    refused(lambda: SchedulerConfig(**{field: value}), message, field)


@pytest.mark.parametrize("field, value, message", [
    ("kv_slots", None, "kv_slots must be an integer, got None"),  # was a TypeError
    ("max_context", 0, "max_context must be >= 2, got 0"),  # was the bundle's context
])
def test_engine_config_refuses_what_it_took_or_tripped_on(field, value, message):
    refused(lambda: EngineConfig(**{field: value}), message, field)


@pytest.mark.parametrize("path, kind", [(None, "NoneType"), (5, "int"), (b"b", "bytes")])
def test_a_bundle_path_of_the_wrong_type_is_a_bundle_error(path, kind):
    # It was a TypeError from os.fspath inside pathlib.
    with pytest.raises(BundleError, match=rf"^the bundle path must be a string or a Path, "
                                          rf"got {kind}$"):
        Engine.load(path)


@pytest.fixture
def make_engine(fake_engine):
    return lambda **options: fake_engine(**{"kv_slots": 2, "chunk_size": 16, **options})


def test_bytes_are_no_prompt(make_engine):
    # b"abc" is a sequence of ints: it was generated from as token ids [97, 98, 99].
    engine = make_engine()
    said = "^a prompt is a string, a list of token ids, or a list of messages; got bytes"
    for call in (lambda: engine.generate(b"abc"), lambda: engine.session().generate(b"abc"),
                 lambda: engine.tokenizer.encode(bytearray(b"abc"))):
        with pytest.raises(RequestError, match=said):
            call()


@pytest.mark.parametrize("prompt, kind", [
    (np.int64(5), "int64"), (np.array(5), "ndarray"), (np.array([[5, 6]]), "ndarray"),
])
def test_a_numpy_scalar_or_a_2d_array_is_no_prompt(make_engine, prompt, kind):
    """A numpy scalar or 0-d array iterated into a TypeError ("iteration over a 0-d
    array"); a 2-d array is no sequence of ids either."""
    engine = make_engine()
    for call in (lambda: engine.generate(prompt), lambda: engine.session().generate(prompt)):
        refused(call, "a prompt is a string, a list of token ids, or a list of messages; "
                      f"got {kind}")
    refused(lambda: engine.submit(prompt, None, 0, None),
            f"token ids must be a sequence of integers, got {kind}")


@pytest.mark.parametrize("data", [b"abc", bytearray(b"abc")])
def test_submit_takes_no_bytes_as_token_ids(make_engine, data):
    # a bytearray was run as ids [97, 98, 99] (bytes were refused)
    engine = make_engine()
    said = f"token ids must be a sequence of integers, got {type(data).__name__}"
    refused(lambda: engine.submit(data, None, 0, None), said)
    refused(lambda: engine.submit_n(data, None, 2), said)


def test_a_session_turn_of_numpy_ids_is_its_ids(make_engine):
    # a numpy array was a ValueError ("the truth value of an array ... is ambiguous")
    engine = make_engine()
    greedy = GenerationParams(max_new_tokens=3)
    ids = [1, 5, 6, 7]
    want = engine.session().generate(ids, greedy).result().token_ids
    assert engine.session().generate(np.array(ids), greedy).result().token_ids == want


@pytest.mark.parametrize("prompt, kind", [(None, "NoneType"), (5, "int"), (2.5, "float")])
def test_a_session_turn_of_the_wrong_type_is_one_line(make_engine, prompt, kind):
    # It was a TypeError from the empty-turn check: "object of type 'int' has no len()".
    session = make_engine().session()
    refused(lambda: session.generate(prompt), "a prompt is a string, a list of token ids, "
                                              f"or a list of messages; got {kind}")


def test_numpy_scalars_are_the_python_values_they_hold(make_engine):
    """np.int64(5) as max_new_tokens was refused as "not a positive integer" (numpy's
    integers are no Python ints); np.float64 passed as a float subclass: now each config,
    the priority and n take a numpy scalar as its Python value."""
    given = GenerationParams(max_new_tokens=np.int64(5), top_k=np.int32(3),
                             seed=np.uint64(7), temperature=np.float32(0.5),
                             top_p=np.float16(0.5), logprobs=np.int8(2),
                             ignore_eos=np.bool_(True),
                             logit_bias={np.int64(5): np.float32(2.0)})
    python = GenerationParams(max_new_tokens=5, top_k=3, seed=7, temperature=0.5,
                              top_p=0.5, logprobs=2, ignore_eos=True, logit_bias={5: 2.0})
    assert given == python
    assert all(type(getattr(given, f)) is type(getattr(python, f)) for f in
               ("max_new_tokens", "top_k", "seed", "temperature", "top_p", "ignore_eos"))
    assert SchedulerConfig(chunk_size=np.int64(16)).chunk_size == 16
    assert EngineConfig(kv_slots=np.int64(3), max_context=np.int16(64)).kv_slots == 3
    engine = make_engine()
    prompt = [1, 5, 6, 7]
    choices = engine.submit_n(prompt, given, np.int64(2), priority=np.int64(-1))
    want = engine.submit_n(prompt, python, 2, priority=-1)
    assert [c.result().token_ids for c in choices] == [w.result().token_ids for w in want]
    with pytest.raises(RequestError, match="max_new_tokens must be a positive integer"):
        GenerationParams(max_new_tokens=np.float64(5.0))  # a float is still no count


def test_n_past_openai_s_limit_is_refused_at_once(make_engine):
    # n=10**6 built a million requests before anything ran (minutes, holding the caller).
    engine = make_engine()
    params = GenerationParams(max_new_tokens=2)
    refused(lambda: engine.submit_n([1, 5], params, 10**6),
            "n must be an integer in 1..128, got 1000000")
    choices = engine.submit_n([1, 5], params, 128)
    assert [c.result().finish_reason for c in choices] == ["length"] * 128
