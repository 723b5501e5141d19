"""Turn one row of logits into a token id in O(vocab): no full sort of the vocabulary.

Per token, in this order (transformers' order of logits processors and warpers):
  penalties (repetition, presence, frequency) and logit_bias -> constraint mask ->
  greedy argmax | temperature -> top-k -> top-p -> min-p -> draw.

Top-k is a partial selection (np.argpartition). Top-p is a weighted selection: the
threshold probability of the nucleus is found by narrowing a band of candidate values
(each pass is a comparison over the survivors, so the whole search is O(vocab)); only a
few thousand survivors are ever sorted. The draw is an inverse CDF over blocks of 1,024
weights, then within one block, so it never runs a cumulative sum over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from edgeprefill.errors import RequestError
from edgeprefill.sdk.params import GenerationParams

SMALL = 16384  # candidate sets this small are simply sorted (a SIMD sort: ~50 us)
BLOCK = 1024  # weights per block of the two-level draw


class TokenMask(Protocol):
    """What a constraint looks like to the sampler (see sdk/constraints.py)."""

    def allowed(self, vocab: int) -> np.ndarray:
        """bool [vocab]: the tokens the constraint accepts next."""

    def accept(self, token: int) -> None:
        """Advance past a sampled token."""

    @property
    def finished(self) -> bool:
        """Nothing may follow the tokens accepted so far."""


class Sampled(NamedTuple):
    token: int
    logprob: float | None  # log-probability of `token` under the model's distribution
    top: list[tuple[int, float]] | None  # the most likely (token, logprob), best first


class Sampler:
    """One per request: owns the request's random generator (a seed reproduces output
    whatever else the engine runs), the counts the penalties need, and the constraint."""

    def __init__(
        self, params: GenerationParams, prompt: Sequence[int] = (),
        mask: TokenMask | None = None,
    ) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.mask = mask
        self._seen = dict.fromkeys(prompt)  # prompt + generated ids (repetition penalty)
        self._counts: dict[int, int] = {}  # generated ids -> occurrences
        bias = params.logit_bias or {}
        self._bias_ids = np.fromiter(bias.keys(), np.int64, len(bias))
        self._bias_values = np.fromiter(bias.values(), np.float32, len(bias))

    @property
    def finished(self) -> bool:
        """The constraint is complete: nothing may follow (the request ends)."""
        return self.mask is not None and self.mask.finished

    def sample(self, logits: np.ndarray, history: Sequence[int] | None = None) -> int:
        """The next token id. logits: CPU float32 [vocab]. `history` (optional) replaces
        the sampler's own record of seen tokens for the repetition penalty."""
        return self.choose(logits, history).token

    def choose(self, logits: np.ndarray, history: Sequence[int] | None = None) -> Sampled:
        """The next token, with its log-probabilities if the request asked for them; the
        token counts as generated from now on (penalties, constraint)."""
        if history is not None:
            self._seen = dict.fromkeys(history)
        adjusted = self._adjust(logits)
        token = self._pick(adjusted)
        sampled = _with_logprobs(logits, token, self.params.logprobs)
        self._accept(token)
        return sampled

    def _adjust(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        out = logits
        if p.repetition_penalty != 1.0 and self._seen:
            out = _repetition(out, self._seen, p.repetition_penalty)
        if self._counts and (p.presence_penalty or p.frequency_penalty):
            out = _presence_frequency(out, self._counts, p.presence_penalty, p.frequency_penalty)
        if self._bias_ids.size:
            if int(self._bias_ids.max()) >= out.shape[0]:
                raise RequestError(f"logit_bias names a token id >= the vocabulary "
                                   f"({out.shape[0]})")
            out = out.copy() if out is logits else out
            out[self._bias_ids] += self._bias_values
        if self.mask is not None:
            allowed = self.mask.allowed(out.shape[0])
            if not allowed.any():
                raise RequestError("the constraint allows no token here")
            out = np.where(allowed, out, np.float32(-np.inf))
        return out

    def _pick(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        kept = nucleus(logits, p.temperature, p.top_k, p.top_p, p.min_p)
        return kept.draw(self.rng)

    def _accept(self, token: int) -> None:
        self._seen[token] = None
        self._counts[token] = self._counts.get(token, 0) + 1
        if self.mask is not None:
            self.mask.accept(token)


# -- the truncated distribution -----------------------------------------------------------


class Kept(NamedTuple):
    """The tokens a draw may choose: candidate i is token `ids[i]` (ids None: token i)
    with unnormalized weight `weights[i]`, kept if its weight is >= `cut`. `weights` is
    zero-padded to whole blocks of BLOCK."""

    ids: np.ndarray | None
    weights: np.ndarray  # float32 [blocks * BLOCK]
    cut: np.float32

    def draw(self, rng: np.random.Generator) -> int:
        i = _inverse_cdf(self.weights, self.cut, rng)
        return int(i if self.ids is None else self.ids[i])

    def probabilities(self, vocab: int) -> np.ndarray:
        """float64 [vocab]: the distribution a draw follows (for tests and checks)."""
        n = vocab if self.ids is None else self.ids.shape[0]
        w = self.weights[:n].astype(np.float64)
        w[w < self.cut] = 0
        out = np.zeros(vocab)
        out[np.arange(n) if self.ids is None else self.ids] = w / w.sum()
        return out


def nucleus(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
            min_p: float) -> Kept:
    """Temperature, then top-k, top-p and min-p, without sorting the vocabulary."""
    ids, x = None, logits
    if 0 < top_k < x.shape[0]:
        ids = np.argpartition(x, -top_k)[-top_k:]
        x = x[ids]
    weights = _weights(x, temperature)
    cut = np.float32(min_p)  # min-p: a weight relative to the top token's (which is 1)
    if top_p < 1.0:
        total = float(weights.sum())  # float32 pairwise summation: ample here
        cut = max(cut, _nucleus_threshold(weights, top_p * total, total))
    return Kept(ids, weights, cut)


def _weights(x: np.ndarray, temperature: float) -> np.ndarray:
    """exp((x - max) / temperature) in float32, zero-padded to whole blocks."""
    n = x.shape[0]
    out = np.zeros(-(-n // BLOCK) * BLOCK, np.float32)
    head = out[:n]
    np.subtract(x, x.max(), out=head)
    if temperature != 1.0:
        np.multiply(head, np.float32(1.0 / temperature), out=head)
    np.exp(head, out=head)
    return out


class _Probe(NamedTuple):
    weight: np.float32  # a threshold
    mass: float  # total weight of the tokens heavier than it
    count: int  # how many they are


def _nucleus_threshold(weights: np.ndarray, target: float, total: float) -> np.float32:
    """The weight of the last token of the nucleus: the largest w such that the tokens
    weighing >= w hold at least `target`. Tokens tied with it are all kept.

    Narrows an interval (lo, hi] of weights known to hold the answer, by exact probes
    placed where an even sample of the weights, rescaled to the interval's exact mass,
    puts the threshold, until at most SMALL tokens lie inside; those are sorted. A probe
    is a comparison, a count and a dot product over the vocabulary: nothing branches on
    the data, which matters on a CPU (a masked sum, np.where, np.bincount or a dense
    gather over random positions each cost 10-20x a plain pass)."""
    lo = _Probe(np.float32(0), total, weights.shape[0])
    hi = _Probe(np.float32(1), 0.0, 0)  # nothing weighs more than the top token (1)
    near_top = _near_top(weights)
    if near_top is not None:
        heavy, probe = near_top
        if probe.mass >= target:  # a peaked distribution: the nucleus is among these
            return _settle(heavy, 0.0, target)
        hi = probe
    step = max(1, weights.shape[0] // 4096)
    sample = weights[::step]
    for _ in range(32):
        if lo.count - hi.count <= SMALL:
            break
        before = (lo, hi)
        for guess in _guesses(sample, lo, hi, target):
            lo, hi = _narrow(lo, hi, _probe(weights, guess), target)
        if (lo, hi) == before:
            break  # ties: no weight splits the interval; sorting settles it
    inside = np.flatnonzero((weights > lo.weight) & (weights <= hi.weight))
    return _settle(weights[inside], hi.mass, target)  # an index gather: 4x a boolean one


def _settle(band: np.ndarray, above: float, target: float) -> np.float32:
    """The answer among `band`, the tokens lighter than a mass `above` < target."""
    ordered = np.sort(band)[::-1]
    reached = above + np.cumsum(ordered, dtype=np.float64)
    last = min(int(np.searchsorted(reached, target)), ordered.shape[0] - 1)
    return ordered[last]


def _near_top(weights: np.ndarray) -> tuple[np.ndarray, _Probe] | None:
    """The tokens within 2^-10 of the top one's weight, if at most SMALL: in a trained
    model's peaked distribution they usually hold the nucleus. Counting first costs
    half a probe when they are too many (a flat distribution)."""
    threshold = np.float32(2.0**-10)
    heavier = weights > threshold
    count = int(np.count_nonzero(heavier))
    if count > SMALL:
        return None
    heavy = weights[np.flatnonzero(heavier)]
    return heavy, _Probe(threshold, float(heavy.sum(dtype=np.float64)), count)


def _probe(weights: np.ndarray, threshold: np.float32) -> _Probe:
    heavier = weights > threshold
    return _Probe(np.float32(threshold), float(np.dot(weights, heavier)),
                  int(np.count_nonzero(heavier)))


def _narrow(lo: _Probe, hi: _Probe, probe: _Probe, target: float) -> tuple[_Probe, _Probe]:
    if not lo.weight < probe.weight < hi.weight:
        return lo, hi
    return (probe, hi) if probe.mass >= target else (lo, probe)


def _guesses(sample: np.ndarray, lo: _Probe, hi: _Probe, target: float) -> list[np.float32]:
    """Two thresholds around the sample's estimate of the answer inside (lo, hi], or the
    log-weight midpoint when the sample has too few points there."""
    inside = np.sort(sample[(sample > lo.weight) & (sample <= hi.weight)])[::-1]
    if inside.shape[0] < 8:
        a = np.log(max(float(lo.weight), 1e-38))
        return [np.float32(np.exp(0.5 * (a + np.log(float(hi.weight)))))]
    reached = np.cumsum(inside, dtype=np.float64)
    reached *= (lo.mass - hi.mass) / reached[-1]  # the exact mass between lo and hi
    at = int(np.searchsorted(reached, target - hi.mass))
    # Aim for a band of about SMALL / 4 tokens around the estimate: one round usually
    # lands within SMALL even when the estimate is off, and a small band gathers fast.
    margin = max(2, int(SMALL / 8 * inside.shape[0] / max(lo.count - hi.count, 1)))
    last = inside.shape[0] - 1
    return [inside[min(max(at - margin, 0), last)], inside[min(at + margin, last)]]


def _inverse_cdf(weights: np.ndarray, cut: np.float32, rng: np.random.Generator) -> int:
    """Index i with probability weights[i] / sum over the kept weights (>= cut).

    Draws from all the weights (a block of BLOCK, then a position inside it) and redraws
    while the token is cut away: conditioned on acceptance this is exactly the kept
    distribution, and with top-p >= 0.5 it accepts at least half the time."""
    blocks = weights.reshape(-1, BLOCK)
    total = np.cumsum(blocks.sum(axis=1), dtype=np.float64)
    for _ in range(64):
        i = _two_level(blocks, total, rng.random())
        if weights[i] >= cut:
            return i
    kept = weights * (weights >= cut)  # rarely: a small kept mass; draw from it directly
    blocks = kept.reshape(-1, BLOCK)
    return _two_level(blocks, np.cumsum(blocks.sum(axis=1), dtype=np.float64), rng.random())


def _two_level(blocks: np.ndarray, total: np.ndarray, u: float) -> int:
    goal = u * total[-1]
    b = min(int(np.searchsorted(total, goal, side="right")), total.shape[0] - 1)
    while b > 0 and total[b] == total[b - 1]:  # rounding landed on an empty block
        b -= 1
    inside = np.cumsum(blocks[b], dtype=np.float64)
    j = min(int(np.searchsorted(inside, goal - (total[b] - inside[-1]), side="right")),
            BLOCK - 1)
    while blocks[b, j] == 0 and j > 0:  # never a zero weight (padding, underflow)
        j -= 1
    return b * BLOCK + j


# -- adjustments ---------------------------------------------------------------------------


def _repetition(logits: np.ndarray, seen: dict[int, None], penalty: float) -> np.ndarray:
    # As in CTRL / transformers: shrink the logits of tokens already seen.
    out = logits.copy()
    ids = np.fromiter(seen, np.int64, len(seen))
    values = out[ids]
    out[ids] = np.where(values > 0, values / penalty, values * penalty)
    return out


def _presence_frequency(
    logits: np.ndarray, counts: dict[int, int], presence: float, frequency: float
) -> np.ndarray:
    # OpenAI's definition, over the generated tokens (as vLLM): mu - c*f - [c > 0]*p.
    out = logits.copy()
    ids = np.fromiter(counts.keys(), np.int64, len(counts))
    c = np.fromiter(counts.values(), np.float32, len(counts))
    out[ids] -= c * np.float32(frequency) + np.float32(presence)
    return out


def _with_logprobs(logits: np.ndarray, token: int, top: int | None) -> Sampled:
    """Log-probabilities under the model's own distribution (before penalties, the
    constraint and temperature: what vLLM reports by default)."""
    if top is None:
        return Sampled(token, None, None)
    x = logits.astype(np.float32, copy=False)
    m = x.max()
    log_z = float(m) + float(np.log(np.exp(x - m).sum(dtype=np.float64)))
    best = None
    if top:
        ids = np.argpartition(x, -top)[-top:]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = [(int(i), float(x[i]) - log_z) for i in ids]
    return Sampled(token, float(x[token]) - log_z, best)
