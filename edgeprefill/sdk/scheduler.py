"""The scheduler: each step, one batched decode call and at most one prefill chunk.

    plan = decode every decoding request (one call, B rows of 1 token, adjacent slots)
         + the next prefill chunk of the request the policy picks (one call, B=1)

Fused (`fuse_steps`, where the bundle's graph packs its valid tokens): both in one call,
the chunk's slot adjacent to the decode rows', so a step reads the weights once. Not when
a decode row's cache has no room for the chunk's padding (its KV past its token is
written and then overwritten, as for any padding): then two calls as above.

It keeps requests in three groups and is the only one that moves them:

  group       slot   meaning
  queued      no     waiting for a KV slot
  prefilling  yes    part of the prompt is in the cache (a preempted prompt waits here)
  decoding    yes    the prompt is in the cache; one token per step

Policies:
  fcfs              arrival order, the whole prompt in one call (the unchunked baseline;
                    a request that gives its own chunk_size is chunked as it asks)
  chunked           arrival order, prompts split into chunks between decode steps
  chunked+priority  lower `priority` value first (vLLM's meaning), strictly: a lower
                    priority waits while higher ones keep coming; at equal priority the
                    shortest remaining prefill first, aged so that no long prompt starves
                    behind shorter ones (see `prefill_score`); the prefill turn may move to
                    another request between two chunks: the preempted one keeps its KV and
                    resumes later
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from edgeprefill.errors import RequestError
from edgeprefill.sdk.chunking import ChunkController
from edgeprefill.sdk.known_fields import known_fields
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.request import Phase, Request
from edgeprefill.values import is_finite, is_int

POLICIES = ("fcfs", "chunked", "chunked+priority")


@known_fields
@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked+priority"
    chunk_size: int | None = None  # fixed prefill chunk; None: adaptive over the buckets
    itl_target_ms: float = 150.0  # adaptive: decode inter-token latency to stay under
    max_step_tokens: int = 4096  # decode rows + prefill chunk tokens per step
    max_queue: int = 256  # waiting requests beyond this are refused
    # chunked+priority: prompt tokens of credit a request earns for each prefill chunk it
    # waits through; a prompt of L tokens waits behind at most L / aging later arrivals.
    aging_tokens: int = 64
    # One call for the decode rows and the prefill chunk where the backend can (a bundle
    # exported with packed tokens, the native attention); False: always two calls. None,
    # the default, and True fuse alike; True says "asked for": the engine warns where the
    # backend cannot.
    fuse_steps: bool | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RequestError(
                f"unknown policy {self.policy!r}; choose one of: {', '.join(POLICIES)}",
                "policy")
        # Types first: a "16" or a None would otherwise fail a comparison below with
        # Python's TypeError, and a 1.5 or a True would pass it.
        for name, low in (("chunk_size", 1), ("max_step_tokens", 1), ("max_queue", 1),
                          ("aging_tokens", 0)):
            value = getattr(self, name)
            if (value is not None or name != "chunk_size") and \
                    not (is_int(value) and value >= low):
                raise RequestError(f"{name} must be an integer >= {low}, got {value!r}", name)
        if self.chunk_size is not None and self.policy == "fcfs":
            raise RequestError("a chunk size does not apply to the fcfs policy, which "
                               "prefills each prompt in one call; use chunked or "
                               "chunked+priority", "chunk_size")
        if not (is_finite(self.itl_target_ms) and self.itl_target_ms > 0):
            raise RequestError(f"itl_target_ms must be a finite number > 0, got "
                               f"{self.itl_target_ms!r}", "itl_target_ms")
        if self.fuse_steps is not None and not isinstance(self.fuse_steps, bool):
            raise RequestError(f"fuse_steps must be True, False or None, got "
                               f"{self.fuse_steps!r}", "fuse_steps")

class PrefillChunk(NamedTuple):
    request: Request
    start: int  # first prompt position of the chunk (== tokens already in the cache)
    length: int  # valid tokens in the chunk


class StepPlan(NamedTuple):
    decode: list[Request]  # in slot order; slots are adjacent (one view of the arena)
    prefill: PrefillChunk | None
    fused: bool = False  # decode rows and prefill in one call (their slots all adjacent)

    @property
    def empty(self) -> bool:
        return not self.decode and self.prefill is None


def prefill_score(request: Request, aging_tokens: int) -> int:
    """Shortest remaining prefill first, aged: each chunk the request waited through
    counts as `aging_tokens` fewer tokens left, so a long prompt overtakes later short
    ones after a bounded wait. An n > 1 sibling that will copy its prompt's KV counts as
    none left: scored by its prompt's length, it let shorter requests take the slots
    until that KV was evicted, and prefilled the prompt again."""
    left = 0 if request.copies_prompt else request.prefill_left
    return left - aging_tokens * request.waited_chunks


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVCache, buckets: list[int],
        backend_fuses: bool = False,
    ) -> None:
        """`backend_fuses`: the backend runs rows of different lengths at the cost of
        their valid tokens (Backend.fuses_rows)."""
        self.config = config
        self.fuse = config.fuse_steps is not False and backend_fuses
        self.kv = kv
        self.chunks = ChunkController(buckets, config.itl_target_ms / 1000)
        self.queued: list[Request] = []  # arrival order
        self.prefilling: list[Request] = []  # arrival order
        self.decoding: list[Request] = []

    def schedule(self) -> StepPlan:
        """The next step's work. May start a queued request (acquires its KV slot) and
        move decoding slots together (the backend swaps their KV)."""
        self._compact()
        prefill = self._next_prefill()
        if not self._fusable(prefill):
            return StepPlan(sorted(self.decoding, key=_slot), prefill)
        assert prefill is not None
        self._compact([prefill.request])
        return StepPlan(sorted(self.decoding, key=_slot), prefill, fused=True)

    def _fusable(self, prefill: PrefillChunk | None) -> bool:
        """Decode rows and a chunk can share a call: each decode row's cache has room for
        the chunk's length (its padding is written there)."""
        if not (self.fuse and self.decoding and prefill is not None):
            return False
        return all(r.kv_len + prefill.length <= self.kv.capacity for r in self.decoding)

    # -- moving requests between groups -------------------------------------------------

    def add(self, request: Request, admitted: bool = False) -> None:
        """Queue a request. `admitted`: an n > 1 sibling of a request the queue already
        took, which waits for a slot past the limit (refusing it would fail a request
        halfway, its tokens generated and thrown away)."""
        if not admitted and len(self.queued) >= self.config.max_queue:
            raise RequestError(f"the queue is full ({self.config.max_queue} requests waiting)")
        self.queued.append(request)

    def prefilled(self, request: Request) -> None:
        """The request's whole prompt is in the cache: it decodes from the next step."""
        self.prefilling.remove(request)
        request.phase = Phase.DECODE
        self.decoding.append(request)

    def adopt(self, request: Request) -> None:
        """A request whose whole prompt is already in its slot (an n > 1 sibling forked
        from its parent's KV) decodes from the next step, past the queue."""
        request.phase = Phase.DECODE
        self.decoding.append(request)

    def remove(self, request: Request) -> None:
        """Drop a finished or cancelled request from whichever group holds it."""
        for group in (self.queued, self.prefilling, self.decoding):
            if request in group:
                group.remove(request)

    def live(self) -> list[Request]:
        return self.queued + self.prefilling + self.decoding

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return len(self.queued)

    @property
    def running(self) -> int:
        """Requests holding a slot: prefilling (possibly preempted) or decoding."""
        return len(self.prefilling) + len(self.decoding)

    # -- prefill choice ---------------------------------------------------------------

    def _next_prefill(self) -> PrefillChunk | None:
        request = self._pick()
        if request is None:
            return None
        for other in self.queued + self.prefilling:
            if other is not request:
                other.waited_chunks += 1
        return PrefillChunk(request, request.kv_len, self._chunk_length(request))

    def _pick(self) -> Request | None:
        if self.config.policy == "chunked+priority":
            return self._pick_by_priority()
        # Arrival order, no preemption: finish the prompt in progress first.
        if self.prefilling:
            return self.prefilling[0]
        if self.queued and self._start(self.queued[0]):
            return self.prefilling[0]
        return None

    def _pick_by_priority(self) -> Request | None:
        aging = self.config.aging_tokens

        def key(r: Request) -> tuple[int, int, int]:
            return (r.priority, prefill_score(r, aging), r.arrival)

        best = min(self.queued + self.prefilling, key=key, default=None)
        if best is not None and best.phase is Phase.QUEUED and not self._start(best):
            best = min(self.prefilling, key=key, default=None)  # no slot: a started one
        return best

    def _start(self, request: Request) -> bool:
        acquired = self.kv.acquire(request.tokens, request.session_id)
        if acquired is None:
            return False  # every slot is busy: wait in the queue
        request.slot, request.kv_len = acquired.slot, acquired.reused
        request.phase = Phase.PREFILL
        request.metrics.scheduled = time.perf_counter()
        request.metrics.prefix_reused = acquired.reused
        self.queued.remove(request)
        self.prefilling.append(request)
        return True

    def _chunk_length(self, request: Request) -> int:
        left = request.prefill_left
        if self.config.policy == "fcfs" and request.chunk_size is None:
            return left  # a request's own chunk size is honoured under any policy
        size = (
            request.chunk_size
            or self.config.chunk_size
            or self.chunks.choose(decoding=bool(self.decoding), fused=self.fuse)
        )
        budget = max(1, self.config.max_step_tokens - len(self.decoding))
        length = max(1, min(size, budget, left))
        # A model with states: end where the cache keeps a snapshot, if the chunk crosses one.
        start = request.kv_len
        return self.kv.chunk_end(_slot(request), start, start + length, length == left) - start

    # -- keeping decode rows adjacent -------------------------------------------------

    def _compact(self, also: list[Request] | None = None) -> None:
        """Decoding slots (and those of `also`) into one contiguous range."""
        if not self.decoding:
            return
        moved = self.kv.compact([_slot(r) for r in self.decoding + (also or [])])
        for request in self.prefilling + self.decoding:
            if request.slot in moved:
                request.slot = moved[request.slot]


def _slot(request: Request) -> int:
    assert request.slot is not None, "a decoding request holds a slot"
    return request.slot
