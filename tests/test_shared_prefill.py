"""Several prompts' prefill chunks in one step (scheduler.py, shared prefill), each its own
row, within the token budget of one chunk, where steps fuse.

References: the same workload with one prompt per step (`prefill_rows=1`): every request's
tokens and every logit row it sampled from (an embedding's vector, a score's head output)
the same; the scheduling on a fake backend's call trace.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from edgeprefill.cli.report import engine_lines
from edgeprefill.errors import RequestError
from edgeprefill.sdk import Engine, GenerationParams, SchedulerConfig
from tests.fake_backend import StatefulFakeBackend, ids


@pytest.fixture
def fusing_engine(fake_engine):
    return lambda **options: fake_engine("fake-fusing", **{
        "kv_slots": 8, "background": False, "prefix_reuse": False, "trace": True,
        "chunk_size": 64, **options})


def run_all(engine, streams) -> None:
    while not all(s.metrics.finish_reason for s in streams):
        engine.step()
    engine.check_integrity()


def prefill_calls(engine) -> list[list[int]]:
    """Each call's prefill chunk lengths, from the engine's trace (a call's chunks share
    its times)."""
    calls: dict[tuple[float, float], list[int]] = defaultdict(list)
    for t in engine.trace:
        if t.kind == "prefill":
            calls[t.start, t.end].append(t.tokens)
    return list(calls.values())


# -- the scheduling, on the fake backend's calls -------------------------------------------


def test_short_prompts_share_a_call_within_one_chunk_s_budget(fusing_engine):
    engine = fusing_engine()
    params = GenerationParams(max_new_tokens=3)
    streams = [engine.generate(ids(20, seed=i), params) for i in range(6)]
    run_all(engine, streams)
    calls = engine.backend.calls
    # 20 + 20 + 20 + the fourth prompt's first 4 tokens fill the first call's 64; the
    # next carries the three decode rows (slots 0-2), the fourth prompt's last 16 tokens
    # and the last two prompts, 56 tokens.
    assert (calls[0].valid_lens, calls[0].past_lens) == ((20, 20, 20, 4), (0, 0, 0, 0))
    assert (calls[1].valid_lens, calls[1].past_lens) == ((1, 1, 1, 16, 20, 20),
                                                         (20, 20, 20, 4, 0, 0))
    assert all(c.kind == "decode" for c in calls[2:])
    # (the policy's order: the last two waited a step, aged past the fourth's 16 left)
    assert prefill_calls(engine) == [[20, 20, 20, 4], [20, 20, 16]]
    assert [s.metrics.chunks for s in streams] == [1, 1, 1, 2, 1, 1]
    m = engine.metrics()
    assert (m.prefill_steps, m.prefill_rows, m.fused_steps) == (2, 7, 1)
    assert "prefill 120 tok in 2 steps (7 prompts' chunks, 3.5 a step)" in engine_lines(m)[0]


def test_decode_rows_take_their_tokens_from_the_step_budget(fusing_engine):
    """max_step_tokens bounds decode rows and prefill tokens together, as for one chunk."""
    engine = fusing_engine(max_step_tokens=40)
    chats = [engine.generate(ids(10, seed=i), GenerationParams(max_new_tokens=30))
             for i in range(2)]
    engine.step()
    streams = [engine.generate(ids(15, seed=9 + i), GenerationParams(max_new_tokens=2))
               for i in range(3)]
    run_all(engine, chats + streams)
    assert prefill_calls(engine)[:3] == [[10, 10], [15, 15, 8], [7]]
    for call in engine.backend.calls:
        decode_rows = call.rows - sum(v > 1 for v in call.valid_lens)
        assert sum(call.valid_lens) <= 40 or call.rows == decode_rows


@pytest.mark.parametrize("options", [{"prefill_rows": 1}, {"policy": "fcfs",
                                                           "chunk_size": None}])
def test_one_prompt_per_step_where_asked_and_under_fcfs(fusing_engine, options):
    engine = fusing_engine(**options)
    streams = [engine.generate(ids(20, seed=i), GenerationParams(max_new_tokens=2))
               for i in range(4)]
    run_all(engine, streams)
    assert all(len(c) == 1 for c in prefill_calls(engine))
    assert engine.metrics().prefill_rows == engine.metrics().prefill_steps == 4


def test_prefill_rows_caps_the_prompts_of_a_step(fusing_engine):
    engine = fusing_engine(prefill_rows=2)
    streams = [engine.generate(ids(10, seed=i), GenerationParams(max_new_tokens=2))
               for i in range(5)]
    run_all(engine, streams)
    assert prefill_calls(engine) == [[10, 10], [10, 10], [10]]


def test_prefill_rows_below_one_is_refused():
    with pytest.raises(RequestError, match="prefill_rows must be an integer >= 1, got 0"):
        SchedulerConfig(prefill_rows=0)


def test_prefill_rows_is_refused_under_fcfs_which_prefills_a_prompt_per_call():
    # It had been taken and ignored (fcfs keeps one whole prompt per call), as a chunk
    # size under fcfs is refused; 1, what fcfs does, is no conflict.
    with pytest.raises(RequestError, match="prefill_rows 2 .* does not apply to the fcfs"):
        SchedulerConfig(policy="fcfs", prefill_rows=2)
    assert SchedulerConfig(policy="fcfs", prefill_rows=1).prefill_rows == 1


def test_a_prompt_sharing_a_prefix_being_written_waits_to_reuse_it(fusing_engine):
    """Two prompts with one 32-token system prompt arriving together: the second waits a
    step and reuses the first's KV (as with one prompt per step) rather than computing it
    beside it; a third, sharing nothing, goes beside the first."""
    engine = fusing_engine(prefix_reuse=True)
    system = ids(32, seed=7)
    params = GenerationParams(max_new_tokens=2)
    first = engine.generate(system + ids(8, seed=1), params)
    second = engine.generate(system + ids(9, seed=2), params)
    other = engine.generate(ids(12, seed=3), params)
    run_all(engine, [first, second, other])
    assert prefill_calls(engine) == [[12, 40], [9]]
    assert second.metrics.prefix_reused == 32


def test_without_prefix_reuse_a_prompt_sharing_a_prefix_does_not_wait(fusing_engine):
    """prefix_reuse=False lends no other slot's KV: waiting a step would compute the same
    tokens a step later, so the second goes beside the first (its first 24 tokens in the
    64-token budget)."""
    engine = fusing_engine(prefix_reuse=False)
    system = ids(32, seed=7)
    params = GenerationParams(max_new_tokens=2)
    first = engine.generate(system + ids(8, seed=1), params)
    second = engine.generate(system + ids(9, seed=2), params)
    run_all(engine, [first, second])
    assert prefill_calls(engine) == [[40, 24], [17]]
    assert second.metrics.prefix_reused == 0


def test_a_prompt_waiting_to_reuse_a_prefix_keeps_its_slot_from_a_lower_priority(
        fusing_engine):
    """Strict priority: a prompt that waits a step to reuse a prefix being written keeps
    its place; a lower priority's prompt behind it does not take the last free slot in
    that step (it then decoded its whole reply while the higher priority waited)."""
    engine = fusing_engine(prefix_reuse=True, kv_slots=2, policy="chunked+priority")
    system = ids(32, seed=7)
    first = engine.generate(system + ids(8, seed=1), GenerationParams(max_new_tokens=2))
    high = engine.generate(system + ids(30, seed=2), GenerationParams(max_new_tokens=2))
    low = engine.generate(ids(6, seed=3), GenerationParams(max_new_tokens=20), priority=1)
    run_all(engine, [first, high, low])
    assert prefill_calls(engine) == [[40], [30], [6]]
    assert high.metrics.prefix_reused == 32
    assert high.metrics.token_times[0] < low.metrics.scheduled


@pytest.mark.parametrize("rows", [None, 1])
def test_an_aged_prompt_waits_for_the_prefix_a_started_one_is_writing(fusing_engine, rows):
    """Strict priority with a small budget: the second prompt's aging overtakes the first
    while the first is still writing their 64-token system prompt. The first goes on
    (its chunks are the second's work too) and the second then reuses the whole prefix;
    started at the overtaking, the two took turns, each computing the shared tokens past
    the first chunk (129 prompt tokens computed for 81), both done later."""
    engine = fusing_engine(prefix_reuse=True, policy="chunked+priority", chunk_size=16,
                           **({} if rows is None else {"prefill_rows": rows}))
    system = ids(64, seed=7)
    params = GenerationParams(max_new_tokens=2)
    first = engine.generate(system + ids(8, seed=1), params)
    second = engine.generate(system + ids(9, seed=2), params)
    run_all(engine, [first, second])
    assert prefill_calls(engine)[:4] == [[16]] * 4
    assert second.metrics.prefix_reused == 64
    assert sum(map(sum, prefill_calls(engine))) == 72 + 9


def test_strict_priority_fills_the_budget_in_its_order(fusing_engine):
    """The extra rows are the policy's next picks: a lower priority value first, then the
    shortest remaining prompt."""
    engine = fusing_engine(chunk_size=32)
    params = GenerationParams(max_new_tokens=2)
    low = engine.generate(ids(6, seed=1), params, priority=5)
    long = engine.generate(ids(20, seed=2), params)
    short = engine.generate(ids(8, seed=3), params)
    run_all(engine, [low, long, short])
    # short (8), long (20), then the lower priority's first 4 tokens (of 6)
    assert prefill_calls(engine)[0] == [8, 20, 4]


class StatefulFusingFakeBackend(StatefulFakeBackend):
    name = "fake-stateful-fusing"

    @property
    def why_not_fused(self) -> str | None:
        return None


def test_state_snapshots_end_each_row_s_chunk_as_they_end_one_prompt_s(fake_engine,
                                                                        monkeypatch):
    """A model with states: each row's chunk ends at its own snapshot point (its slot's
    period, or where its prompt parts from a cached one), and its states are saved after
    the shared call, as after a call of its own: the tokens are one prompt per step's."""
    from edgeprefill import engines

    monkeypatch.setitem(engines.BACKENDS, "fake-stateful-fusing",
                        "tests.test_shared_prefill:StatefulFusingFakeBackend")
    system = ids(40, seed=7)
    prompts = [system + ids(30, seed=1), ids(50, seed=2), system + ids(25, seed=3),
               ids(23, seed=4)]

    def run(**options):
        engine = fake_engine("fake-stateful-fusing", kv_slots=4, background=False,
                             chunk_size=64, trace=True, **options)
        params = GenerationParams(max_new_tokens=6)
        first = engine.generate(prompts[0], params)
        run_all(engine, [first])
        streams = [engine.generate(p, params) for p in prompts[1:]]
        run_all(engine, streams)
        return [s.result().token_ids for s in (first, *streams)], engine

    shared, engine = run()
    assert shared == run(prefill_rows=1)[0]
    # The first prompt: 64 + 6. Then shortest first: the 23-token prompt whole; the
    # 50-token one's chunk of the 41 left ends at 32 (the 16-token period: not its last
    # chunk); the 65-token one takes the last 9. Next step its chunk ends at 32, where it
    # parts from the cached first prompt (a snapshot there), beside the 50's last 18.
    assert prefill_calls(engine) == [[64], [6], [23, 32, 9], [18, 23], [33]]


# -- exactness on exported bundles ---------------------------------------------------------


def sampled_logits(path, prompts: list[list[int]], **options):
    """Three prompts arrive together, then the rest while those decode (fixed chunks of
    64): each request's tokens and every logit row it sampled from."""
    engine = Engine.load(path, threads=2, background=False, kv_slots=6, trace=True,
                         chunk_size=64, prefix_reuse=False, **options)
    seen: dict[int, list[np.ndarray]] = defaultdict(list)
    emit = engine._emit

    def spy(request, logits):
        seen[request.id].append(logits.copy())
        emit(request, logits)

    engine._emit = spy
    params = GenerationParams(max_new_tokens=6, ignore_eos=True)
    streams = [engine.generate(p, params) for p in prompts[:3]]
    engine.step()
    engine.step()
    streams += [engine.generate(p, params) for p in prompts[3:]]
    run_all(engine, streams)
    rows = max(len(c) for c in prefill_calls(engine))
    engine.close()
    return [s.result().token_ids for s in streams], [np.stack(seen[k]) for k in sorted(seen)], rows


def prompt(n: int, seed: int) -> list[int]:
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, 120, size=n - 1)]


# Where a call's rows are their own (the attention, the states), a prompt's numbers differ
# only where ONNX Runtime's float32 MatMul sums a row in another order in a call of more
# rows (engines/ort/fusing.py): measured on an AMD EPYC, llama, qwen3, lfm2, qwen3_5_text
# and granitemoehybrid-mamba came out bit for bit, minicpm3 within 7e-7, the experts of
# qwen3_moe and deepseek_v3 (which multiply each expert's tokens together) within 3e-6;
# the tokens are the same. lfm2 (short convolutions), qwen3_5_text (Gated DeltaNet) and
# granitemoehybrid-mamba (Mamba-2) carry states; minicpm3 and deepseek_v3 latent attention.
FAMILIES = ("llama", "qwen3", "lfm2", "qwen3_5_text", "granitemoehybrid-mamba", "minicpm3",
            "qwen3_moe", "deepseek_v3")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_steps_sample_from_one_prompt_per_step_s_logits(bundle, library, family):
    path = bundle(family)
    prompts = [prompt(n, seed=n) for n in (9, 30, 17, 20, 45, 12)]
    tokens, logits, rows = sampled_logits(path, prompts)
    alone_tokens, alone_logits, alone_rows = sampled_logits(path, prompts, prefill_rows=1)
    assert rows > 1 and alone_rows == 1
    assert tokens == alone_tokens
    for got, want in zip(logits, alone_logits, strict=True):
        np.testing.assert_allclose(got, want, **TOLERANCE)


@pytest.fixture(scope="module")
def embed_bundle(tmp_path_factory):
    from edgeprefill.export.exporter import ExportOptions, export
    from tests.conftest import build_hf_model
    from tests.test_embed import as_embedding_model

    hf = as_embedding_model(build_hf_model("qwen3", tmp_path_factory.mktemp("embedding")))
    out = tmp_path_factory.mktemp("bundle-embedding")
    export(hf, out, ExportOptions(chunks=(16, 64), max_context=128, show_progress=False))
    return out


def test_embedding_texts_sharing_steps_get_their_vectors_alone(embed_bundle, library):
    texts = [" ".join(f"w{3 + (7 * i + j) % 90}" for j in range(3 + 5 * i % 23))
             for i in range(10)]
    vectors = {}
    for rows in (None, 1):
        with Engine.load(embed_bundle, threads=2, kv_slots=4, prefill_rows=rows) as engine:
            vectors[rows] = engine.embed(texts)
            m = engine.metrics()
            assert (m.prefill_rows > m.prefill_steps) == (rows is None)
    np.testing.assert_allclose(vectors[None], vectors[1], **TOLERANCE)


def test_scored_pairs_sharing_steps_get_their_scores_alone(tmp_path_factory, library):
    from tests.conftest import build_hf_model
    from tests.test_score import TEMPLATE, export_score

    hf = build_hf_model("qwen3", tmp_path_factory.mktemp("reranker"))
    path = export_score(hf, tmp_path_factory.mktemp("bundle-reranker"), ("w5", "w6"),
                        TEMPLATE)
    pairs = [("w10 w11", " ".join(f"w{20 + (3 * i + j) % 70}" for j in range(2 + 3 * i)))
             for i in range(8)]
    scores = {}
    for rows in (None, 1):
        with Engine.load(path, threads=2, kv_slots=4, prefill_rows=rows) as engine:
            scores[rows] = engine.score(pairs)
            m = engine.metrics()
            assert (m.prefill_rows > m.prefill_steps) == (rows is None)
    np.testing.assert_allclose(scores[None], scores[1], **TOLERANCE)
