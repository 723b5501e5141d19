"""Temperature, top-k, top-p and min-p in O(vocab): the distribution a draw follows, and
the draw, without sorting the vocabulary.

Top-k is a partial selection (np.argpartition). Top-p is applied by rejection: a token
drawn from the whole (temperature-scaled, top-k cut) distribution is kept when the
tokens strictly heavier than it hold less than top_p of the mass — one comparison and
one dot product over the vocabulary — and drawn again otherwise. Conditioned on being
kept, that is exactly the nucleus distribution, and with top_p >= 0.5 a draw is kept at
least half the time (at top_p 0.95, 95%). The draw is an inverse CDF over blocks of 1,024
weights, then inside one block: no cumulative sum over the vocabulary.

The nucleus's exact threshold (`Kept.exact_cut`, for `probabilities` and the rare
fallback) needs the weight of its last token: the tokens near the top are counted (a
peaked distribution settles there), else exact probes bracket it where a sample of the
weights says it is, and only the few thousand tokens left between the bounds are sorted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SMALL = 16384  # candidate sets this small are simply sorted (a SIMD sort: ~50 us)
BLOCK = 1024  # weights per block of the two-level draw


class Scratch:
    """Float32 buffers, zero-padded to whole blocks, that one sampler reuses for every
    token; a `Kept` built on them is valid until the next `nucleus` call."""

    def __init__(self) -> None:
        self._weights = np.zeros(0, np.float32)
        self._mask = np.zeros(0, np.float32)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(weights, mask) for n candidates; weights' padding past n is zero."""
        size = -(-n // BLOCK) * BLOCK
        if self._weights.shape[0] != size:
            self._weights = np.zeros(size, np.float32)
            self._mask = np.zeros(size, np.float32)
        else:
            self._weights[n:] = 0  # a previous call may have had more candidates (top-k)
        return self._weights, self._mask


class Kept(NamedTuple):
    """The tokens a draw may choose: candidate i is token `ids[i]` (ids None: token i)
    with unnormalized weight `weights[i]`, kept if its weight is >= `cut` (min-p) and, when
    `target` is set (top-p), the candidates strictly heavier than it weigh < `target`.
    `weights` is zero-padded to whole blocks of BLOCK."""

    ids: np.ndarray | None
    weights: np.ndarray  # float32 [blocks * BLOCK]
    cut: np.float32
    target: float | None  # top_p * total weight; None: no top-p cut
    top: np.float32  # the top token's weight (1, or exp(max logit): see _weights)
    totals: np.ndarray  # float64 [blocks]: cumulative block sums (the draw's first level)
    mask: np.ndarray  # float32 [blocks * BLOCK]: scratch for the acceptance test

    def draw(self, rng: np.random.Generator) -> int:
        blocks = self.weights.reshape(-1, BLOCK)
        for _ in range(64):
            i = _two_level(blocks, self.totals, rng.random())
            if self._kept(self.weights[i]):
                return self._token(i)
        # Rarely (a tiny kept mass): draw from the exact nucleus directly.
        return self._token(_inverse_cdf(self.weights, self.exact_cut(), rng))

    def exact_cut(self) -> np.float32:
        """The smallest kept weight: min-p's cut, or the nucleus's last token if higher."""
        if self.target is None:
            return self.cut
        total = float(self.totals[-1])
        return max(self.cut, _nucleus_threshold(self.weights, self.target, total))

    def probabilities(self, vocab: int) -> np.ndarray:
        """float64 [vocab]: the distribution a draw follows (for tests and checks)."""
        n = vocab if self.ids is None else self.ids.shape[0]
        w = self.weights[:n].astype(np.float64)
        w[w < self.exact_cut()] = 0
        out = np.zeros(vocab)
        out[np.arange(n) if self.ids is None else self.ids] = w / w.sum()
        return out

    def _kept(self, weight: np.float32) -> bool:
        if weight < self.cut:
            return False
        if self.target is None:
            return True
        # The mass strictly heavier than this token (no count: only the mass decides): a
        # comparison written as 0/1 floats, then a BLAS dot (a bool operand is cast first).
        np.greater(self.weights, weight, out=self.mask)
        return float(np.dot(self.weights, self.mask)) < self.target

    def _token(self, i: int) -> int:
        return int(i if self.ids is None else self.ids[i])


def nucleus(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
            min_p: float, scratch: Scratch | None = None) -> Kept:
    """Temperature, then top-k, top-p and min-p, without sorting the vocabulary."""
    ids, x = None, logits
    if 0 < top_k < x.shape[0]:
        ids = np.argpartition(x, -top_k)[-top_k:]
        x = x[ids]
    weights, mask = (scratch or Scratch()).take(x.shape[0])
    top = _weights(x, temperature, weights)
    # float64 sums of the float32 BLAS block sums: the total and the draw's first level
    totals = np.cumsum(_block_sums(weights.reshape(-1, BLOCK)), dtype=np.float64)
    cut = np.float32(min_p) * top  # min-p: a weight relative to the top token's
    target = top_p * float(totals[-1]) if top_p < 1.0 else None
    return Kept(ids, weights, cut, target, top, totals, mask)


UNSHIFTED = (0.0, 64.0)  # top scaled logits for which exp needs no shift by the max


def _weights(x: np.ndarray, temperature: float, out: np.ndarray) -> np.float32:
    """exp(x / temperature) in float32 into out[:n] (its padding stays zero); returns the
    top token's weight. The textbook exp((x - max) / temperature) costs one more pass over
    the vocabulary; the shift is skipped when the scaled max lies in UNSHIFTED: nothing
    overflows (even summed over 2^20 tokens) and nothing underflows that the shift would
    have kept. Else the shift is applied and the top weight is 1."""
    head = out[:x.shape[0]]
    best = int(np.argmax(x))
    scale = np.float32(1.0 / temperature)
    if UNSHIFTED[0] <= float(x[best]) * float(scale) <= UNSHIFTED[1]:
        src = x
    else:
        src = np.subtract(x, x[best], out=head)
    if temperature != 1.0:
        # A logit at float32's minimum (a model's masked tokens: Chameleon's image tokens)
        # scaled up overflows to -inf, whose weight exp makes 0, as it should be.
        with np.errstate(over="ignore"):
            src = np.multiply(src, scale, out=head)
    np.exp(src, out=head)
    return np.float32(head[best])


class _Probe(NamedTuple):
    weight: np.float32  # a threshold
    mass: float  # total weight of the tokens heavier than it
    size: int  # how many they are (not `count`: tuple.count)


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
    top = weights.max()  # not Kept.top: a rare path, and exp may not be monotone to the ulp
    hi = _Probe(top, 0.0, 0)  # nothing weighs more than the top token
    near_top = _near_top(weights, top)
    if near_top is not None:
        heavy, probe = near_top
        if probe.mass >= target:  # a peaked distribution: the nucleus is among these
            return _settle(heavy, 0.0, target)
        hi = probe
    step = max(1, weights.shape[0] // 4096)
    sample = weights[::step]
    for _ in range(32):
        if lo.size - hi.size <= SMALL:
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
    return np.float32(ordered[last])


def _near_top(weights: np.ndarray, top: np.float32) -> tuple[np.ndarray, _Probe] | None:
    """The tokens within 2^-10 of the top one's weight, if at most SMALL: in a trained
    model's peaked distribution they usually hold the nucleus. Counting first costs
    half a probe when they are too many (a flat distribution)."""
    threshold = np.float32(2.0**-10) * top
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
    margin = max(2, int(SMALL / 8 * inside.shape[0] / max(lo.size - hi.size, 1)))
    last = inside.shape[0] - 1
    return [inside[min(max(at - margin, 0), last)], inside[min(at + margin, last)]]


def _inverse_cdf(weights: np.ndarray, cut: np.float32, rng: np.random.Generator) -> int:
    """Index i with probability weights[i] / sum over the kept weights (>= cut).

    Draws from all the weights (a block of BLOCK, then a position inside it) and redraws
    while the token is cut away: conditioned on acceptance this is exactly the kept
    distribution, and with top-p >= 0.5 it accepts at least half the time."""
    blocks = weights.reshape(-1, BLOCK)
    total = np.cumsum(_block_sums(blocks), dtype=np.float64)
    for _ in range(64):
        i = _two_level(blocks, total, rng.random())
        if weights[i] >= cut:
            return i
    kept = weights * (weights >= cut)  # rarely: a small kept mass; draw from it directly
    blocks = kept.reshape(-1, BLOCK)
    return _two_level(blocks, np.cumsum(_block_sums(blocks), dtype=np.float64), rng.random())


_ONES = np.ones(BLOCK, np.float32)


def _block_sums(blocks: np.ndarray) -> np.ndarray:
    """Each block's total: a BLAS matrix-vector product, ~3x numpy's row sums."""
    return blocks @ _ONES


def _two_level(blocks: np.ndarray, total: np.ndarray, u: float) -> int:
    goal = u * total[-1]
    b: int = min(int(np.searchsorted(total, goal, side="right")), total.shape[0] - 1)
    while b > 0 and total[b] == total[b - 1]:  # rounding landed on an empty block
        b -= 1
    inside = np.cumsum(blocks[b], dtype=np.float64)
    j: int = min(int(np.searchsorted(inside, goal - (total[b] - inside[-1]), side="right")),
                 BLOCK - 1)
    while blocks[b, j] == 0 and j > 0:  # never a zero weight (padding, underflow)
        j -= 1
    return b * BLOCK + j
