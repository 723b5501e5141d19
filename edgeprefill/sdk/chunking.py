"""Adaptive prefill chunk size: the largest bucket that keeps decode responsive.

While sessions are decoding, the gap between two of their tokens is one decode call plus
one prefill chunk, or one fused call holding both (scheduler.py). The controller measures
online (exponential moving averages of seconds per prefill token for each bucket, a fused
call's time counted as its chunk's, and seconds per decode call) and picks the largest
bucket whose predicted chunk time fits in the inter-token latency target, beside the
decode call where the two are separate calls. With nobody decoding, the largest bucket
wins (throughput).
"""

from __future__ import annotations

SMOOTHING = 0.3  # weight of the newest measurement


class ChunkController:
    def __init__(self, buckets: list[int], itl_target_s: float) -> None:
        self.buckets = sorted(buckets)
        self.target = itl_target_s
        self.per_token: dict[int, float] = {}  # bucket -> seconds per prefill token
        self.decode_s: float | None = None

    def choose(self, decoding: bool, fused: bool = False) -> int:
        """`fused`: the chunk shares its call with the decode rows, whose cost the chunk's
        measured time then holds."""
        if not decoding:
            return self.buckets[-1]
        budget = self.target - (0.0 if fused else (self.decode_s or 0.0))
        fitting = [b for b in self.buckets if self._predict(b) <= budget]
        return fitting[-1] if fitting else self.buckets[0]

    def observe_prefill(self, length: int, seconds: float) -> None:
        bucket = min(self.buckets, key=lambda b: abs(b - length))
        self.per_token[bucket] = _ema(self.per_token.get(bucket), seconds / max(1, length))

    def observe_decode(self, seconds: float) -> None:
        self.decode_s = _ema(self.decode_s, seconds)

    def _predict(self, bucket: int) -> float:
        if bucket in self.per_token:
            return bucket * self.per_token[bucket]
        smaller = [b for b in self.per_token if b < bucket]
        if not smaller:
            # Unmeasured and nothing smaller measured: only the smallest bucket may probe.
            return 0.0 if bucket == self.buckets[0] else float("inf")
        # Per-token cost falls with chunk size, so the nearest smaller bucket's rate is a
        # safe (pessimistic) estimate; measuring it then corrects the estimate.
        return bucket * self.per_token[max(smaller)]


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
