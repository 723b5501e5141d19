"""One generation request as the scheduler sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from edgeprefill.sdk.metrics import RequestMetrics
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.sampler import Sampler
from edgeprefill.sdk.stream import TokenStream
from edgeprefill.sdk.tokenizer import TextStreamer


class Phase(enum.Enum):
    QUEUED = "queued"  # waiting for a slot
    PREFILL = "prefill"  # has a slot; prompt partly in the KV cache
    DECODE = "decode"  # prompt in the cache; one token per decode step
    DONE = "done"


@dataclass(eq=False)
class Request:
    id: int
    tokens: list[int]  # the prompt (a session's whole conversation so far)
    params: GenerationParams
    priority: int  # lower runs first (vLLM's meaning); 0 by default
    arrival: int  # tie-breaker: earlier first
    session_id: int | None
    stream: TokenStream
    sampler: Sampler
    text: TextStreamer
    metrics: RequestMetrics
    phase: Phase = Phase.QUEUED
    slot: int | None = None
    kv_len: int = 0  # prompt + generated tokens whose KV is in the slot
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    chunk_size: int | None = None  # overrides the scheduler's chunk choice
    waited_chunks: int = 0  # prefill chunks of other requests run while this one waited
    # n > 1: the sibling requests, queued once this prompt's KV exists
    followers: list[Request] = field(default_factory=list)
    # An n > 1 sibling waiting for a slot while its prompt's KV is in the cache: its
    # prefill is a copy of that KV, the cheapest there is (Scheduler's prefill_score).
    copies_prompt: bool = False
    # An embedding request (Engine.submit_embedding): prefilled, its last token's hidden
    # state handed to its stream, and done; it decodes nothing.
    embeds: bool = False

    @property
    def prefill_left(self) -> int:
        return len(self.tokens) - self.kv_len

    @property
    def max_total(self) -> int | None:
        """Prompt + generated tokens this request may reach (None: the context limit)."""
        mnt = self.params.max_new_tokens
        return None if mnt is None else len(self.tokens) + mnt
