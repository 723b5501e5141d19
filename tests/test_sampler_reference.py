"""The O(vocab) sampler against a straightforward full-sort reference, on the same
distributions; greedy, seeds, penalties, logit_bias, logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.errors import RequestError
from edgeprefill.sdk import GenerationParams
from edgeprefill.sdk.nucleus import Scratch, nucleus
from edgeprefill.sdk.sampler import Sampler


def reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
              min_p: float) -> np.ndarray:
    """The textbook pipeline: sort everything, cut, renormalize (float64)."""
    x = logits.astype(np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    if 0 < top_k < x.shape[0]:
        order = order[:top_k]
    p = np.exp(x[order] - x[order].max())
    p /= p.sum()
    if top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    if min_p > 0:
        keep = p >= min_p * p.max()
        order, p = order[keep], p[keep] / p[keep].sum()
    out = np.zeros(x.shape[0])
    out[order] = p
    return out


SETTINGS = [  # temperature, top_k, top_p, min_p
    (1.0, 0, 0.95, 0.0), (0.7, 50, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (1.3, 0, 0.5, 0.01),
    (1.0, 1000, 0.99, 0.0), (0.5, 0, 0.8, 0.1),
]


@pytest.mark.parametrize("vocab", [1000, 49152, 151936])
@pytest.mark.parametrize("scale", [1.0, 3.0, 8.0])  # flat (random weights) .. peaked
def test_truncated_distribution_equals_the_full_sort_reference(vocab, scale):
    logits = (np.random.default_rng(vocab).standard_normal(vocab) * scale).astype(np.float32)
    for setting in SETTINGS:
        ours = nucleus(logits, *setting).probabilities(vocab)
        ref = reference(logits, *setting)
        # Same kept set, except where float32 and float64 sums disagree on the token
        # that sits exactly at the top-p boundary (at most a handful of ties in mass).
        differ = np.flatnonzero((ours > 0) != (ref > 0))
        assert differ.size <= 3, (setting, differ.size)
        np.testing.assert_allclose(ours, ref, atol=2e-5)


@pytest.mark.parametrize("offset", [-80.0, 0.0, 30.0, 500.0])
def test_the_distribution_does_not_depend_on_where_the_logits_sit(offset):
    # exp skips the shift by the max for moderate logits and applies it otherwise
    # (nucleus._weights): both paths, and min-p relative to the top token, on either.
    logits = (np.random.default_rng(9).standard_normal(20_000) * 3 + offset).astype(np.float32)
    for setting in SETTINGS:
        ours = nucleus(logits, *setting).probabilities(20_000)
        ref = reference(logits, *setting)
        assert np.flatnonzero((ours > 0) != (ref > 0)).size <= 3, setting
        np.testing.assert_allclose(ours, ref, atol=2e-5)


def test_ties_at_the_boundary_are_all_kept():
    logits = np.zeros(10_000, np.float32)  # all equal: the whole vocabulary is one tie
    probs = nucleus(logits, 1.0, 0, 0.5, 0.0).probabilities(10_000)
    np.testing.assert_allclose(probs, 1e-4)


@pytest.mark.parametrize("setting", SETTINGS[:4])
def test_draws_follow_the_reference_distribution(setting):
    vocab = 6_000  # several blocks of the two-level draw
    logits = (np.random.default_rng(7).standard_normal(vocab) * 4).astype(np.float32)
    ref = reference(logits, *setting)
    temperature, top_k, top_p, min_p = setting
    sampler = Sampler(GenerationParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                       min_p=min_p, seed=11))
    draws = np.array([sampler.sample(logits) for _ in range(2000)])
    assert ref[draws].min() > 0  # never a token the reference cuts away
    heavy = np.argsort(-ref)[:5]
    for token in heavy:  # frequencies of the likeliest tokens within ~4 sigma
        expected = ref[token]
        sigma = np.sqrt(expected * (1 - expected) / len(draws))
        assert abs(np.mean(draws == token) - expected) < 4 * sigma + 1e-3


def test_draws_from_flat_logits_follow_the_reference_distribution():
    # A random-weight model's near-uniform logits: thousands of tokens in the nucleus and
    # its boundary among equally likely ones, so rejection runs on typical tokens.
    vocab, n = 20_000, 20_000
    logits = np.random.default_rng(3).standard_normal(vocab).astype(np.float32)
    ref = reference(logits, 1.0, 0, 0.95, 0.0)
    sampler = Sampler(GenerationParams(temperature=1.0, top_p=0.95, seed=5))
    draws = np.array([sampler.sample(logits) for _ in range(n)])
    assert ref[draws].min() > 0  # never a token the reference cuts away
    # Chi-square over 20 bins of equal reference mass, tokens ordered by probability (the
    # last bin holds the nucleus's lightest tokens, next to the cut ones), then by id (the
    # two-level draw's blocks).
    order = np.argsort(-ref)[:np.count_nonzero(ref)]
    edges = np.searchsorted(np.cumsum(ref[order]), np.linspace(0, 1, 21)[1:-1])
    by_rank = np.zeros(vocab, np.int64)
    by_rank[order] = np.searchsorted(edges, np.arange(order.shape[0]), side="right")
    by_id = np.searchsorted(np.cumsum(ref), np.linspace(0, 1, 21)[1:-1])
    for bin_of in (by_rank, np.searchsorted(by_id, np.arange(vocab), side="right")):
        expected = np.bincount(bin_of, weights=ref, minlength=20) * n
        observed = np.bincount(bin_of[draws], minlength=20)
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 50, chi2  # 19 degrees of freedom: p ~ 1e-4


def test_reused_scratch_gives_each_call_its_own_distribution():
    scratch, rng = Scratch(), np.random.default_rng(4)
    for vocab in (3000, 2500, 3000, 7000):  # 3000 and 2500 share the padded size
        logits = rng.standard_normal(vocab).astype(np.float32)
        ours = nucleus(logits, 1.0, 0, 0.9, 0.0, scratch).probabilities(vocab)
        np.testing.assert_allclose(ours, reference(logits, 1.0, 0, 0.9, 0.0), atol=2e-5)


def test_greedy_is_the_argmax_bit_for_bit():
    logits = np.random.default_rng(0).standard_normal(151_936).astype(np.float32)
    sampler = Sampler(GenerationParams())
    assert sampler.sample(logits) == int(np.argmax(logits))
    assert Sampler(GenerationParams(temperature=1.0, top_k=1)).sample(logits) == \
        int(np.argmax(logits))


def test_a_seed_reproduces_the_draws():
    logits = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)
    params = GenerationParams(temperature=1.0, top_p=0.95, seed=42)
    a = [Sampler(params).sample(logits) for _ in range(3)]
    first, second = Sampler(params), Sampler(params)
    assert [first.sample(logits) for _ in range(50)] == [second.sample(logits) for _ in range(50)]
    assert len(set(a)) == 1


def test_presence_and_frequency_penalties_count_generated_tokens():
    logits = np.array([5.0, 4.0, 0.0], np.float32)
    sampler = Sampler(GenerationParams(frequency_penalty=0.6, presence_penalty=0.5),
                      prompt=[1])  # the prompt does not count (as vLLM)
    # 0: 5 -> 3.9 -> 3.3 -> 2.7; 1: 4 -> 2.9
    assert [sampler.sample(logits) for _ in range(5)] == [0, 1, 0, 0, 1]


def test_logit_bias_moves_tokens():
    logits = np.array([1.0, 2.0, 3.0], np.float32)
    assert Sampler(GenerationParams(logit_bias={0: 100})).sample(logits) == 0
    assert Sampler(GenerationParams(logit_bias={2: -100})).sample(logits) == 1
    with pytest.raises(RequestError, match="logit_bias"):
        Sampler(GenerationParams(logit_bias={7: 1.0})).sample(logits)
    with pytest.raises(RequestError):
        GenerationParams(logit_bias={0: 101})


def test_logprobs_are_the_models_log_softmax():
    logits = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    log_softmax = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    sampled = Sampler(GenerationParams(logprobs=3)).choose(logits)
    assert sampled.token == int(np.argmax(logits))
    assert sampled.logprob == pytest.approx(log_softmax[sampled.token], abs=1e-5)
    assert [t for t, _ in sampled.top] == list(np.argsort(-logits)[:3])
    assert sampled.top[0][1] == pytest.approx(sampled.logprob)
    assert Sampler(GenerationParams()).choose(logits).logprob is None


@pytest.mark.parametrize("bad", [
    dict(min_p=1.5), dict(presence_penalty=3), dict(frequency_penalty=float("nan")),
    dict(logprobs=21), dict(logit_bias={-1: 1.0}),
])
def test_new_parameters_are_checked(bad):
    with pytest.raises(RequestError):
        GenerationParams(**bad)
