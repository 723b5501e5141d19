"""Turn one row of logits into a token id: greedy, temperature, top-k, top-p, penalty."""

from __future__ import annotations

import numpy as np

from edgeprefill.sdk.params import GenerationParams


class Sampler:
    """One per request: owns the request's random generator, so a seed reproduces output
    whatever else the engine is running."""

    def __init__(self, params: GenerationParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """logits: CPU float32 [vocab]; history: token ids so far (for the penalty)."""
        p = self.params
        if p.repetition_penalty != 1.0 and history:
            logits = _penalize(logits, history, p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        candidates = _top_k(scaled, p.top_k)
        probs = _softmax(scaled[candidates])
        candidates, probs = _top_p(candidates, probs, p.top_p)
        return int(self.rng.choice(candidates, p=probs))


def _penalize(logits: np.ndarray, history: list[int], penalty: float) -> np.ndarray:
    # As in CTRL / transformers: shrink the logits of tokens already seen.
    out = logits.copy()
    seen = np.unique(np.asarray(history, dtype=np.int64))
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of candidate tokens, highest logit first."""
    if 0 < k < logits.shape[0]:
        top = np.argpartition(-logits, k - 1)[:k]
        return top[np.argsort(-logits[top], kind="stable")]
    return np.argsort(-logits, kind="stable")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_p(candidates: np.ndarray, probs: np.ndarray, top_p: float):
    if top_p >= 1.0:
        return candidates, probs
    # Keep the smallest head whose mass reaches top_p (always at least one token).
    keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
    head = probs[:keep]
    return candidates[:keep], head / head.sum()
