"""The scheduler: each step, one batched decode call and the prefill chunks of a token budget.

    plan = decode every decoding request (one call, B rows of 1 token, adjacent slots)
         + the next prefill chunk of the request the policy picks (one call, B=1)

Fused (`fuse_steps`, where the bundle's graph packs its valid tokens): both in one call,
the chunk's slot adjacent to the decode rows', so a step reads the weights once. Not when
a decode row's cache has no room for the chunk's padding (its KV past its token is
written and then overwritten, as for any padding): then two calls as above.

Shared prefill (where steps fuse, but for fcfs): a chunk shorter than the step's prefill
budget (the length the scheduler picks for one chunk: the fixed chunk size or the adaptive
one) leaves the rest of the budget to the prompts the policy would pick next, each its own
row (own slot, own past), in the same call: many short prompts (texts to embed, chat users
arriving together) then share a step's fixed cost, and the step's prefill tokens, so the
decode rows' inter-token latency, stay what one chunk's are. `prefill_rows` caps the rows
(1: one prompt per step). A queued prompt that shares a prefix with another row of the step
beyond what the cache holds waits a step instead, to reuse that row's KV; no queued prompt
after it in the policy's order takes a slot before it.

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
from edgeprefill.sdk.kv_cache import KVCache, common_prefix
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
    # Prompts whose prefill chunks one fused step carries, each its own row, within the
    # step's one-chunk token budget; None: as many as the budget and the slots allow, 1: one
    # prompt per step (as where steps do not fuse, and under fcfs, which refuses more).
    prefill_rows: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise RequestError(
                f"unknown policy {self.policy!r}; choose one of: {', '.join(POLICIES)}",
                "policy")
        # Types first: a "16" or a None would otherwise fail a comparison below with
        # Python's TypeError, and a 1.5 or a True would pass it.
        for name, low in (("chunk_size", 1), ("max_step_tokens", 1), ("max_queue", 1),
                          ("aging_tokens", 0), ("prefill_rows", 1)):
            value = getattr(self, name)
            if (value is not None or name not in ("chunk_size", "prefill_rows")) and \
                    not (is_int(value) and value >= low):
                raise RequestError(f"{name} must be an integer >= {low}, got {value!r}", name)
        if self.chunk_size is not None and self.policy == "fcfs":
            raise RequestError("a chunk size does not apply to the fcfs policy, which "
                               "prefills each prompt in one call; use chunked or "
                               "chunked+priority", "chunk_size")
        if self.prefill_rows is not None and self.prefill_rows > 1 and self.policy == "fcfs":
            raise RequestError(f"prefill_rows {self.prefill_rows} (prompts per shared prefill "
                               "step) does not apply to the fcfs policy, which prefills one "
                               "whole prompt per call; use chunked or chunked+priority",
                               "prefill_rows")
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
    prefill: list[PrefillChunk]  # in the policy's order, one per prompt; one unless fused
    fused: bool = False  # every row in one call (their slots all adjacent)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


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
        self.prefill_rows = (1 if not self.fuse or config.policy == "fcfs"
                     else config.prefill_rows or len(kv.slots))  # prompts per step
        self.kv = kv
        self.chunks = ChunkController(buckets, config.itl_target_ms / 1000)
        self.queued: list[Request] = []  # arrival order
        self.prefilling: list[Request] = []  # arrival order
        self.decoding: list[Request] = []

    def schedule(self) -> StepPlan:
        """The next step's work. May start queued requests (acquires their KV slots) and
        move slots together (the backend swaps their KV)."""
        self._compact()
        first = self._pick()
        chunks = self._chunks(first) if first is not None else []
        if chunks:
            self._age([c.request for c in chunks])
        fused = len(chunks) > 1 or bool(self.decoding) and self._fusable(chunks)
        if fused:
            self._compact([c.request for c in chunks])
        return StepPlan(sorted(self.decoding, key=_slot), chunks, fused)

    def _fusable(self, chunks: list[PrefillChunk]) -> bool:
        """Decode rows and chunks can share a call: each row's cache has room for the
        longest chunk's length (its padding is written there)."""
        if not (self.fuse and chunks):
            return False
        width = max(c.length for c in chunks)
        rows = self.decoding + [c.request for c in chunks]
        return all(r.kv_len + width <= self.kv.capacity for r in rows)

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

    def _chunks(self, first: Request) -> list[PrefillChunk]:
        """The step's prefill: `first`'s next chunk and, where the step fuses, the chunks
        of the next prompts the policy picks while the budget has tokens left, rows are
        allowed and every row has room for the padding."""
        budget = self._step_budget(first)
        chunks = [self._chunk(first, budget)]
        if self.prefill_rows == 1 or self.decoding and not self._fusable(chunks):
            return chunks  # one prompt per step, or two calls: the chunk alone
        left = budget - chunks[0].length
        held = False  # a queued prompt waits: none after it in the policy's order starts
        for request in self._next_ones(first):
            if left < 1 or len(chunks) >= self.prefill_rows:
                break
            if request.phase is Phase.QUEUED and (held or not self._may_start(request, chunks)):
                # Under priority a started (preempted) prompt behind it may still join;
                # a queued one may not take a slot the waiting one would need next step.
                held = True
                continue
            chunk = self._chunk(request, min(left, request.chunk_size or left))
            if not self._fusable([*chunks, chunk]):
                break  # a slot it may have taken now: it prefills in a later step
            chunks.append(chunk)
            left -= chunk.length
        return chunks

    def _age(self, picked: list[Request]) -> None:
        for other in self.queued + self.prefilling:
            if other not in picked:
                other.waited_chunks += 1

    def _next_ones(self, first: Request) -> list[Request]:
        """The requests the policy would pick after `first`, in its order."""
        if self.config.policy == "chunked+priority":
            waiting = sorted(self.queued + self.prefilling, key=self._priority_key)
        else:
            waiting = self.prefilling + self.queued  # arrival order, started ones first
        return [r for r in waiting if r is not first]

    def _may_start(self, request: Request, chunks: list[PrefillChunk]) -> bool:
        """Start a queued prompt beside `chunks` unless it shares a longer prefix with one
        of theirs than the cache holds (a system prompt being written now: a step later it
        reuses that KV; not without prefix reuse, which lends no other slot's KV) or no
        slot is free."""
        if self._writing_prefix_of(request, [c.request for c in chunks]):
            return False
        return self._start(request)

    def _writing_prefix_of(self, request: Request, others: list[Request]) -> list[Request]:
        """Those of `others` that share a longer prefix with `request` than the cache holds
        (a system prompt they are writing now), where prefixes are lent across slots:
        started beside them, `request` would compute that prefix again."""
        if not self.kv.share_prefixes:
            return []
        cached = self.kv.cached_prefix(request.tokens)
        return [r for r in others
                if common_prefix(request.tokens, r.tokens) >= cached + self.kv.align]

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
        key = self._priority_key
        best = min(self.queued + self.prefilling, key=key, default=None)
        if best is None or best.phase is not Phase.QUEUED:
            return best
        # A started prompt writing the best one's prefix goes first: its chunk is the best
        # one's work, which then reuses it. Started beside it (aged past it), the two took
        # turns, each computing the shared part past the cache's first block.
        writers = self._writing_prefix_of(best, self.prefilling)
        if writers:
            return min(writers, key=key)
        if not self._start(best):
            best = min(self.prefilling, key=key, default=None)  # no slot: a started one
        return best

    def _priority_key(self, r: Request) -> tuple[int, int, int]:
        return (r.priority, prefill_score(r, self.config.aging_tokens), r.arrival)

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

    def _step_budget(self, request: Request) -> int:
        """The prefill tokens of the step whose first chunk is `request`'s: the length the
        scheduler picks for one chunk (fcfs: its whole prompt)."""
        if self.config.policy == "fcfs" and request.chunk_size is None:
            return request.prefill_left  # a request's own chunk size is honoured under any policy
        size = (
            request.chunk_size
            or self.config.chunk_size
            or self.chunks.choose(decoding=bool(self.decoding), fused=self.fuse)
        )
        return max(1, min(size, self.config.max_step_tokens - len(self.decoding)))

    def _chunk(self, request: Request, tokens: int) -> PrefillChunk:
        """The request's next chunk, at most `tokens` long."""
        left = request.prefill_left
        if self.config.policy == "fcfs" and request.chunk_size is None:
            return PrefillChunk(request, request.kv_len, left)
        length = max(1, min(tokens, left))
        # A model with states: end where the cache keeps a snapshot, if the chunk crosses one.
        start = request.kv_len
        end = self.kv.chunk_end(_slot(request), start, start + length, length == left)
        return PrefillChunk(request, start, end - start)

    # -- keeping decode rows adjacent -------------------------------------------------

    def _compact(self, also: list[Request] | None = None) -> None:
        """Decoding slots (and those of `also`) into one contiguous range."""
        together = self.decoding + (also or [])
        if len(together) < 2:
            return
        moved = self.kv.compact([_slot(r) for r in together])
        for request in self.prefilling + self.decoding:
            if request.slot in moved:
                request.slot = moved[request.slot]


def _slot(request: Request) -> int:
    assert request.slot is not None, "a decoding request holds a slot"
    return request.slot
