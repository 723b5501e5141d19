"""The runtime of models whose layers carry a recurrent state beside (or instead of) KV:
LFM2's and LFM3's short convolutions, Qwen3.5's Gated DeltaNet, Kimi Linear's KDA, Granite
4.0-H's and Falcon-H1's Mamba-2, ZAYA's compressed convolutional attention, MiniMax's
lightning attention, and plain
Mamba-2, Mamba-1, RWKV-4 and xLSTM (no layer attends: a slot arena without KV).
Whatever the batch, the fused rows, the slot moves and the reuse, each
sequence's state is its own and the text is transformers'. (The families' own graphs are
tested in test_lfm2.py, test_lfm3.py, test_qwen3_5.py, test_kda.py, test_mamba2.py
and test_falcon_h1.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.engines import StepBatch
from edgeprefill.sdk import Engine, GenerationParams
from tests.state_models import assert_copy_and_swap_continue
from tests.test_exactness import prompt_ids, reference_greedy, reference_logits

# Falcon-H1's layers keep KV and states both; Mamba-2's keep no KV at all (its slots hold
# states alone).
FAMILIES = ("lfm2", "lfm3", "qwen3_5_text", "granitemoehybrid-mamba", "falcon_h1", "mamba2",
            "kimi_linear",  # KDA beside NoPE latent attention (its one cached head)
            "rwkv",  # RWKV-4: token-shift and WKV states, no KV
            "xlstm",  # xLSTM: an mLSTM cell's C | n | m state, no KV
            "zaya",  # CCA's convolution and delayed-value states beside every layer's KV
            "minimax",  # lightning attention's one state beside softmax layers' KV
            # Mamba-1 (as Mamba-2), Jamba, Zamba2, Zamba, RecurrentGemma and Bailing
            # hybrid (Kimi Linear's states): slow
            *(pytest.param(family, marks=pytest.mark.slow)
              for family in ("mamba", "falcon_mamba", "jamba", "zamba2", "zamba",
                             "recurrent_gemma", "bailing_hybrid",
                             "inkling_text")))  # its four conv states beside the KV
FLAVORS = ("ort", "standard")
PARAMS = GenerationParams(max_new_tokens=8, ignore_eos=True)

pytestmark = pytest.mark.parametrize("family", FAMILIES)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_chunk_row_beside_decode_rows_keeps_each_rows_state_its_own(family, flavor,
                                                                      hf_model, bundle):
    """One call of rows with different valid lengths: each row's logits and next state
    are its own (padding never enters a state)."""
    a, b, c = prompt_ids(30, seed=3), prompt_ids(21, seed=4), prompt_ids(26, seed=5)
    expected = [reference_logits(hf_model(family), ids) for ids in (a, b, c)]
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    if flavor == "ort" and engine.backend.why_not_fused:
        pytest.skip(f"this ort graph takes no fused rows: {engine.backend.why_not_fused}")
    run = engine.backend.run
    for slot, ids in ((0, a[:10]), (1, b[:19]), (2, c[:24])):
        run(StepBatch(np.array([ids]), np.array([0], np.int32),
                      np.array([len(ids)], np.int32), slot))
    ids = np.full((3, 16), 77, np.int64)
    ids[0], ids[1, 0], ids[2, 0] = a[10:26], b[19], c[24]
    logits = run(StepBatch(ids, np.array([10, 19, 24], np.int32),
                           np.array([16, 1, 1], np.int32), 0))
    for row, position in enumerate((25, 19, 24)):
        np.testing.assert_allclose(logits[row], expected[row][position], rtol=1e-4, atol=1e-4)
    # The chunk row's state ends at its 16th token, the decode rows' at their one token.
    logits = run(StepBatch(np.array([a[26:30]]), np.array([26], np.int32),
                           np.array([4], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected[0][29], rtol=1e-4, atol=1e-4)
    logits = run(StepBatch(np.array([[b[20]], [c[25]]]), np.array([20, 25], np.int32),
                           np.array([1, 1], np.int32), 1))
    for row, (want, position) in enumerate(((expected[1], 20), (expected[2], 25))):
        np.testing.assert_allclose(logits[row], want[position], rtol=1e-4, atol=1e-4)
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_copying_and_swapping_a_slot_move_its_states_with_its_kv(family, flavor, hf_model,
                                                                 bundle):
    """Prefix lending copies a slot, keeping decode rows adjacent swaps two: the next
    chunk in the slot the content moved to continues it as transformers does."""
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    assert_copy_and_swap_continue(engine, hf_model(family))
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_greedy_text_is_transformers_chunked_or_not_alone_or_batched(family, flavor, hf_model,
                                                                     bundle):
    hf_dir = hf_model(family)
    prompts = [prompt_ids(n, seed=n) for n in (5, 30, 61)]
    expected = [reference_greedy(hf_dir, ids) for ids in prompts]
    engine = Engine.load(bundle(family, flavor), threads=2, background=False,
                         prefix_reuse=False)
    for ids, want in zip(prompts, expected, strict=True):
        for chunk in (2, 16, None):
            got = engine.generate(ids, PARAMS, chunk_size=chunk or len(ids)).result()
            assert got.token_ids == want, f"length {len(ids)}, chunk {chunk}"
    streams = [engine.generate(ids, PARAMS, chunk_size=16) for ids in prompts]  # together
    assert [s.result().token_ids for s in streams] == expected
    # Where the graph takes them, later prompts' chunks ran beside earlier ones' decode rows.
    assert (engine.metrics().fused_steps > 0) == engine.backend.fuses_rows
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_second_turn_reuses_the_whole_slot_and_continues_its_states(family, flavor,
                                                                      hf_model, bundle):
    hf_dir = hf_model(family)
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, chunk_size=16)
    session = engine.session()
    first, second = prompt_ids(45), prompt_ids(21, seed=7)[1:]
    reply = session.generate(first, PARAMS).result().token_ids
    assert reply == reference_greedy(hf_dir, first)
    got = session.generate(second, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, first + reply + second)
    # The slot held the first prompt and the reply but its last token (never fed back).
    assert got.metrics.prefix_reused == len(first) + len(reply) - 1
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_prompt_that_diverges_from_a_cached_one_resumes_from_a_snapshot(family, flavor,
                                                                          hf_model, bundle):
    """In the one slot there is, which shares the new prompt's first 32 tokens but then
    differs: its live states are those of its own last token, so the prefix is reused up
    to the snapshot of its states the cache kept at 32 (test_state_snapshots.py)."""
    hf_dir = hf_model(family)
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, chunk_size=16,
                         kv_slots=1)
    cached = prompt_ids(50)
    engine.generate(cached, PARAMS).result()
    diverging = cached[:32] + prompt_ids(20, seed=9)[1:]
    got = engine.generate(diverging, PARAMS).result()
    assert got.token_ids == reference_greedy(hf_dir, diverging)
    assert got.metrics.prefix_reused == 32
    # A prompt the slot's whole token list begins is served from it.
    longer = diverging + got.token_ids + prompt_ids(9, seed=11)[1:]
    again = engine.generate(longer, PARAMS).result()
    assert again.token_ids == reference_greedy(hf_dir, longer)
    assert again.metrics.prefix_reused == len(diverging) + len(got.token_ids) - 1
    engine.close()
