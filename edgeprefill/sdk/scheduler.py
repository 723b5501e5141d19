"""The scheduler: each step, one batched decode call and at most one prefill chunk.

    plan = decode every running request (one call, B rows of 1 token)
         + the next prefill chunk of the request the policy picks (one call, B=1)

Policies:
  fcfs              arrival order, the whole prompt in one call (the unchunked baseline)
  chunked           arrival order, prompts split into chunks between decode steps
  chunked+priority  priority order (then arrival); a higher-priority arrival takes the
                    prefill turn from a lower-priority request between its chunks; the
                    preempted request keeps its KV and resumes later
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from edgeprefill.errors import RequestError
from edgeprefill.sdk.chunking import ChunkController
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.request import Phase, Request

POLICIES = ("fcfs", "chunked", "chunked+priority")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked+priority"
    chunk_size: int | None = None  # fixed prefill chunk; None: adaptive over the buckets
    itl_target_ms: float = 150.0  # adaptive: decode inter-token latency to stay under
    max_step_tokens: int = 4096  # decode rows + prefill chunk tokens per step
    max_queue: int = 256  # waiting requests beyond this are refused

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RequestError(
                f"unknown policy {self.policy!r}; choose one of: {', '.join(POLICIES)}"
            )
        if self.chunk_size is not None and self.chunk_size < 1:
            raise RequestError(f"chunk size must be >= 1, got {self.chunk_size}")
        if not self.itl_target_ms > 0:
            raise RequestError(f"ITL target must be > 0 ms, got {self.itl_target_ms}")
        if self.max_step_tokens < 1 or self.max_queue < 1:
            raise RequestError("max_step_tokens and max_queue must be >= 1")


class PrefillChunk(NamedTuple):
    request: Request
    start: int  # first prompt position of the chunk (== tokens already in the cache)
    length: int  # valid tokens in the chunk


class StepPlan(NamedTuple):
    decode: list[Request]
    prefill: PrefillChunk | None

    @property
    def empty(self) -> bool:
        return not self.decode and self.prefill is None


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCache, buckets: list[int]) -> None:
        self.config = config
        self.kv = kv
        self.chunks = ChunkController(buckets, config.itl_target_ms / 1000)
        self.waiting: list[Request] = []  # QUEUED and PREFILL, in arrival order
        self.decoding: list[Request] = []

    def schedule(self) -> StepPlan:
        """The next step's work. May start a queued request (acquires its KV slot)."""
        return StepPlan(list(self.decoding), self._next_prefill())

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.config.max_queue:
            raise RequestError(f"the queue is full ({self.config.max_queue} requests waiting)")
        self.waiting.append(request)

    def to_decode(self, request: Request) -> None:
        self.waiting.remove(request)
        request.phase = Phase.DECODE
        self.decoding.append(request)

    def remove(self, request: Request) -> None:
        """Drop a finished or cancelled request from whichever list holds it."""
        for group in (self.waiting, self.decoding):
            if request in group:
                group.remove(request)

    @property
    def queue_depth(self) -> int:
        return sum(r.phase is Phase.QUEUED for r in self.waiting)

    # -- prefill choice ---------------------------------------------------------------

    def _next_prefill(self) -> PrefillChunk | None:
        request = self._pick()
        if request is None:
            return None
        return PrefillChunk(request, request.kv_len, self._chunk_length(request))

    def _pick(self) -> Request | None:
        started = [r for r in self.waiting if r.phase is Phase.PREFILL]
        queued = [r for r in self.waiting if r.phase is Phase.QUEUED]
        if self.config.policy == "chunked+priority":
            best = min(self.waiting, key=lambda r: r.order, default=None)
            if best is not None and best.phase is Phase.QUEUED and not self._start(best):
                best = min(started, key=lambda r: r.order, default=None)
            return best
        # Arrival order, no preemption: finish the prompt in progress first.
        if started:
            return started[0]
        if queued and self._start(queued[0]):
            return queued[0]
        return None

    def _start(self, request: Request) -> bool:
        acquired = self.kv.acquire(request.tokens, request.session_id)
        if acquired is None:
            return False  # every slot is busy: wait in the queue
        request.slot, request.kv_len = acquired.slot, acquired.reused
        request.phase = Phase.PREFILL
        request.metrics.scheduled = time.perf_counter()
        request.metrics.prefix_reused = acquired.reused
        return True

    def _chunk_length(self, request: Request) -> int:
        left = request.prefill_left
        if self.config.policy == "fcfs":
            return left
        size = (
            request.chunk_size
            or self.config.chunk_size
            or self.chunks.choose(decoding=bool(self.decoding))
        )
        budget = max(1, self.config.max_step_tokens - len(self.decoding))
        return max(1, min(size, budget, left))
