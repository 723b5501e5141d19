"""The public SDK refuses a wrong argument at the call, in one line that names it (a
RequestError, or the documented BundleError), and never takes it silently: the cases a
pass over the API with wrong types and values found (Engine.load's options, prompts,
embedding and rerank texts, n). Run on the fake backend where only the engine's logic is
under test."""

from __future__ import annotations

import pytest

from edgeprefill.errors import BundleError, RequestError
from edgeprefill.sdk import Engine, EngineConfig, SchedulerConfig


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
