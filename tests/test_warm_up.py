"""The load's warm-up: one chunk call and one decode call, which change nothing a request
sees. Checked on the fake backend, whose next token is a function of everything a row
attends to (tests/fake_backend.py): a request reading the warm-up's KV would answer
differently. (The exactness tests against transformers run with the warm-up on.)"""

from __future__ import annotations

import threading

import pytest

from edgeprefill.errors import BackendError
from edgeprefill.sdk import GenerationParams
from tests.fake_backend import Call, FakeBackend, ids


def test_load_runs_the_largest_chunk_and_a_decode_call_over_every_slot(fake_engine):
    engine = fake_engine(warm_up=True, kv_slots=3, background=False)
    assert engine.backend.calls == [
        Call("prefill", 0, 1, 64, (0,), (64,)),  # the llama bundle's chunks are 16 and 64
        Call("decode", 0, 3, 1, (0, 0, 0), (1, 1, 1)),
    ]


def test_the_warm_up_chunk_fits_a_small_context(fake_engine):
    engine = fake_engine(warm_up=True, kv_slots=2, max_context=40, background=False)
    assert engine.backend.calls[0] == Call("prefill", 0, 1, 40, (0,), (40,))


def test_warm_up_keeps_no_books_and_changes_no_answer(fake_engine):
    prompts = [ids(70, seed) for seed in range(4)]  # one per slot, each longer than a chunk
    answers = {}
    for warm_up in (True, False):
        engine = fake_engine(warm_up=warm_up, kv_slots=4, background=False)
        metrics = engine.metrics()
        assert (metrics.prefill_tokens, metrics.decode_steps, metrics.kv_tokens) == (0, 0, 0)
        streams = [engine.generate(p, GenerationParams(max_new_tokens=8, ignore_eos=True))
                   for p in prompts]
        while engine.step():
            pass
        answers[warm_up] = [s.result().token_ids for s in streams]
    assert answers[True] == answers[False]


def test_a_fixed_chunk_size_is_the_warm_up_chunk(fake_engine):
    engine = fake_engine(warm_up=True, chunk_size=32, background=False)
    assert engine.backend.calls[0] == Call("prefill", 0, 1, 32, (0,), (32,))


class FailingBackend(FakeBackend):
    closed = False

    def run(self, step):
        raise RuntimeError("out of device memory")

    def close(self) -> None:
        FailingBackend.closed = True


def test_a_failing_first_call_fails_the_load_in_one_line_and_frees_the_backend(
        fake_engine, monkeypatch):
    from edgeprefill import engines

    monkeypatch.setitem(engines.BACKENDS, "failing", "tests.test_warm_up:FailingBackend")
    with pytest.raises(BackendError, match="first call .*: out of device memory"):
        fake_engine(backend="failing", warm_up=True)
    assert FailingBackend.closed


class ThreadRecordingBackend(FakeBackend):
    def run(self, step):
        self.threads = [*getattr(self, "threads", []), threading.current_thread().name]
        return super().run(step)


def test_the_warm_up_runs_on_the_thread_that_runs_the_steps(fake_engine, monkeypatch):
    """ONNX Runtime and the kernels keep per-thread state: warming another thread left the
    first request slow in some processes."""
    from edgeprefill import engines

    monkeypatch.setitem(engines.BACKENDS, "recording", "tests.test_warm_up:ThreadRecordingBackend")
    engine = fake_engine(backend="recording", warm_up=True)
    engine.generate(ids(20), GenerationParams(max_new_tokens=2, ignore_eos=True)).result()
    assert set(engine.backend.threads) == {"edgeprefill"}  # the loop thread's name
    assert len(engine.backend.threads) == 2 + 2  # warm-up: two calls; the request: two
    engine = fake_engine(backend="recording", warm_up=True, background=False)
    assert engine.backend.threads == [threading.current_thread().name] * 2
