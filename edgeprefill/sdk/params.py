"""Sampling and stopping parameters of one request, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgeprefill.errors import RequestError


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int | None = 256  # None: until EOS, a stop string or the context is full
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1: no nucleus cut
    repetition_penalty: float = 1.0  # 1: none
    seed: int | None = None
    stop: tuple[str, ...] = ()  # generation ends before any of these strings
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        _check(self.max_new_tokens is None or _int(self.max_new_tokens) and
               self.max_new_tokens >= 1, "max_new_tokens must be a positive integer")
        _check(_finite(self.temperature) and self.temperature >= 0,
               "temperature must be a finite number >= 0")
        _check(_int(self.top_k) and self.top_k >= 0, "top_k must be an integer >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]")
        _check(_finite(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty must be a finite number > 0")
        # numpy's default_rng refuses negative seeds: refuse them here, at submit.
        _check(self.seed is None or _int(self.seed) and self.seed >= 0,
               "seed must be an integer >= 0")
        _check(all(isinstance(s, str) and s for s in self.stop),
               "stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RequestError(message)
