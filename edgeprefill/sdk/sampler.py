"""Turn one row of logits into a token id in O(vocab): no full sort of the vocabulary.

Per token, in this order (transformers' order of logits processors and warpers):
  penalties (repetition, presence, frequency) and logit_bias -> constraint mask ->
  thinking budget (a forced token: the only one allowed; sdk/thinking_budget.py) ->
  greedy argmax | temperature -> top-k -> top-p -> min-p -> draw (sdk/nucleus.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

# At import: numpy loads numpy.random on first use, which cost a fresh process's first
# request 6-8 ms of its TTFT.
from numpy.random import default_rng

from edgeprefill.errors import RequestError
from edgeprefill.sdk.nucleus import Scratch, nucleus
from edgeprefill.sdk.params import GenerationParams

if TYPE_CHECKING:
    from edgeprefill.sdk.thinking_budget import ThinkingBudget


class TokenMask(Protocol):
    """What a constraint looks like to the sampler (see sdk/constraints.py)."""

    def allowed(self, vocab: int) -> np.ndarray:
        """bool [vocab]: the tokens the constraint accepts next."""

    def accept(self, token: int) -> None:
        """Advance past a sampled token."""

    def takes(self, tokens: list[int]) -> bool:
        """Whether all of `tokens` may come next (nothing is advanced)."""

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
        mask: TokenMask | None = None, budget: ThinkingBudget | None = None,
    ) -> None:
        self.params = params
        self.rng = default_rng(params.seed)
        self.mask = mask
        self.budget = budget
        self._seen = dict.fromkeys(prompt)  # prompt + generated ids (repetition penalty)
        self._counts: dict[int, int] = {}  # generated ids -> occurrences
        bias = params.logit_bias or {}
        self._bias_ids = np.fromiter(bias.keys(), np.int64, len(bias))
        self._bias_values = np.fromiter(bias.values(), np.float32, len(bias))
        self._scratch = Scratch()  # the draw's buffers, reused token after token
        self._forcing = False  # this step's token is the thinking budget's

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
        forced = self._forced()
        self._forcing = forced is not None
        if forced is not None:  # greedy or drawn, only this token can come
            only = np.full_like(out, -np.inf)
            only[forced] = out[forced] if np.isfinite(out[forced]) else 0.0
            out = only
        return out

    def _forced(self) -> int | None:
        """The thinking budget's token for this step, if any. Under a lazy grammar (strict
        tools) the close begins only where the grammar takes all of it: inside a call the
        reasoning opened it would be cut into the call's JSON, so it waits for the call's
        end (the model's tokens meanwhile are the call's)."""
        budget = self.budget
        if budget is None or budget.forced() is None:
            return None
        if self.mask is None or budget.closing_begun or self.mask.takes(budget.to_force):
            return budget.forced()
        return None

    def _pick(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        kept = nucleus(logits, p.temperature, p.top_k, p.top_p, p.min_p, self._scratch)
        return kept.draw(self.rng)

    def _accept(self, token: int) -> None:
        self._seen[token] = None
        self._counts[token] = self._counts.get(token, 0) + 1
        if self.mask is not None:
            self.mask.accept(token)
        if self.budget is not None:
            self.budget.accept(token, self._forcing)


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
