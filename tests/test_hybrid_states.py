"""What every hybrid family with a recurrent state of its own computes across chunks and rows
(Jamba's Mamba-1 layers beside attention, Zamba's and Zamba2's shared blocks, RecurrentGemma's
RG-LRU): each chunking of a prompt, a padded last chunk included, gives transformers'
logits (ort with the native kernels and without, standard), and prompts of different
lengths decoded together give transformers' greedy text. Each family's own module tests
what is its own."""

from __future__ import annotations

import pytest

from edgeprefill.sdk import Engine
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_exactness import check_together

HYBRIDS = ("jamba", "zamba", "zamba2", "recurrent_gemma")


@pytest.mark.parametrize("family", HYBRIDS)
@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        family, flavor, kernels, hf_model, bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model(family), bundle(family, flavor))


# Zamba's rows together are slow-marked (7 s of the default suite's time): Zamba2 keeps
# the shared-block state decoded in batches covered there.
BATCHED = [pytest.param(f, marks=pytest.mark.slow) if f == "zamba" else f for f in HYBRIDS]


@pytest.mark.parametrize("family", BATCHED)
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_prompts_of_different_lengths_generated_together_are_transformers_greedy(
        family, flavor, hf_model, bundle):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_together(engine, hf_model(family), new_tokens=8)
    engine.close()
