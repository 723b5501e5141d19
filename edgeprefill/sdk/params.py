"""Sampling and stopping parameters of one request, checked once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeprefill.errors import RequestError
from edgeprefill.sdk.known_fields import known_fields
from edgeprefill.values import is_finite, is_int, plain

if TYPE_CHECKING:
    from edgeprefill.sdk.constraints import Constraint

MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs
# The stop strings' automaton (sdk/stop_matcher.py) is built at submit, ~200 bytes per
# character: far past what stops a reply (OpenAI allows 4 strings), well short of a cost.
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 10_000


@known_fields
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
    min_p: float = 0.0  # 0: none; else drop tokens less likely than min_p x the top token
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit
    logprobs: int | None = None  # None: none; 0: the chosen token's; k: plus the top k
    constraint: Constraint | None = None  # structured output (sdk/constraints.py)
    # max_new_tokens as a cap the context may cut: a prompt that leaves less room than
    # max_new_tokens generates to the context's end (finish reason "length") instead of
    # being refused at submit. What `edgeprefill run` does when --max-new-tokens is not given.
    fit_context: bool = False
    # The most tokens a reply's reasoning (its <think> block) may take before its end is
    # forced and the reply goes on as the answer (sdk/thinking_budget.py); None: no cap.
    # 0 closes the block at once. Needs a bundle whose template knows the tags.
    thinking_budget: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise RequestError("stop must be a string or a list of strings", "stop")
        self._check_sampling()
        self._check_extras()

    def _check_sampling(self) -> None:
        _check(self.max_new_tokens is None or is_int(self.max_new_tokens) and
               self.max_new_tokens >= 1, "max_new_tokens must be a positive integer",
               "max_new_tokens")
        _check(is_finite(self.temperature) and self.temperature >= 0,
               "temperature must be a finite number >= 0", "temperature")
        _check(is_int(self.top_k) and self.top_k >= 0, "top_k must be an integer >= 0",
               "top_k")
        _check(is_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]",
               "top_p")
        _check(is_finite(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty must be a finite number > 0", "repetition_penalty")
        # numpy's default_rng refuses negative seeds: refuse them here, at submit.
        _check(self.seed is None or is_int(self.seed) and self.seed >= 0,
               "seed must be an integer >= 0", "seed")
        _check(all(isinstance(s, str) and s for s in self.stop),
               "stop strings must be non-empty strings", "stop")
        chars = sum(map(len, self.stop))
        _check(len(self.stop) <= MAX_STOP_STRINGS and chars <= MAX_STOP_CHARS,
               f"at most {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS:,} characters in "
               f"all, got {len(self.stop)} strings, {chars:,} characters", "stop")
        for name in ("ignore_eos", "fit_context"):  # "false" would be truthy
            _check(isinstance(getattr(self, name), bool), f"{name} must be true or false",
                   name)

    def _check_extras(self) -> None:
        _check(is_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]",
               "min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(is_finite(value) and -2 <= value <= 2, f"{name} must be in [-2, 2]", name)
        if isinstance(self.logit_bias, Mapping):  # numpy ids and biases as Python's
            object.__setattr__(self, "logit_bias", {
                plain(k): plain(v) for k, v in self.logit_bias.items()})
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, Mapping) and all(
                is_int(k) and k >= 0 and is_finite(v) and -100 <= v <= 100
                for k, v in self.logit_bias.items()),
                "logit_bias maps token ids >= 0 to numbers in [-100, 100]", "logit_bias")
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        _check(self.logprobs is None or is_int(self.logprobs) and
               0 <= self.logprobs <= MAX_LOGPROBS, f"logprobs must be in [0, {MAX_LOGPROBS}]",
               "logprobs")
        _check(self.thinking_budget is None or is_int(self.thinking_budget) and
               self.thinking_budget >= 0, "thinking_budget must be an integer >= 0",
               "thinking_budget")
        if self.constraint is not None:
            # A grammar that leaves the reasoning free (lazy, or after_thinking) lets the
            # budget's forced close through; one over the whole reply would refuse it.
            _check(self.thinking_budget is None
                   or getattr(self.constraint, "frees_reasoning", False),
                   "thinking_budget cannot be combined with a constraint over the whole "
                   "reply (the grammar governs it from the first token, which leaves no "
                   "reasoning to cap)",
                   "thinking_budget")
            from edgeprefill.sdk.constraints import Constraint

            _check(isinstance(self.constraint, Constraint),
                   "constraint must be an edgeprefill.sdk.constraints.Constraint")
            _check(not self.ignore_eos, "ignore_eos cannot be combined with a constraint "
                   "(the constraint decides where the output ends)", "ignore_eos")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _check(ok: bool, message: str, field: str | None = None) -> None:
    if not ok:
        raise RequestError(message, field)
