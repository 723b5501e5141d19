"""The engine: a bundle on a backend, one KV cache, one step loop.

    step = schedule -> decode call -> prefill chunk call -> sample -> stream

Callers on any thread submit requests and cancellations through an inbox; only the step
loop (a background thread, or whoever calls `step()`) touches the scheduler, the KV
cache and the backend.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from pathlib import Path

import numpy as np

from edgeprefill.bundle import Manifest, load_manifest
from edgeprefill.engines import BackendOptions, StepBatch, create_backend
from edgeprefill.errors import EngineClosedError, RequestError
from edgeprefill.sdk.config import EngineConfig, StepTrace
from edgeprefill.sdk.generation_defaults import GenerationDefaults
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.metrics import EngineCounters, EngineMetrics, RequestMetrics
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.request import Phase, Request
from edgeprefill.sdk.sampler import Sampled, Sampler
from edgeprefill.sdk.scheduler import PrefillChunk, Scheduler, SchedulerConfig
from edgeprefill.sdk.stream import TokenEvent, TokenStream
from edgeprefill.sdk.tokenizer import BundleTokenizer, Prompt, TextStreamer


def _nth_seed(params: GenerationParams, i: int) -> GenerationParams:
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + i)


class Engine:
    def __init__(self, bundle_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.config = config = config or EngineConfig()
        self.manifest: Manifest = load_manifest(self.bundle_dir, config.verify_checksums)
        self.tokenizer = BundleTokenizer(self.bundle_dir, self.manifest)
        self.generation_defaults = GenerationDefaults.load(self.bundle_dir)
        options = BackendOptions(device=config.device, threads=config.threads, spin=config.spin)
        self.backend = create_backend(config.backend, self.bundle_dir, self.manifest, options)
        self.capacity = self._capacity()
        buckets = list(self.manifest.chunks)
        self.kv = KVCache(
            self.backend, self._slots(), self.capacity, align=buckets[0],
            share_prefixes=config.prefix_reuse,
        )
        self.trace: list[StepTrace] = []
        self.scheduler = Scheduler(config.scheduler, self.kv, buckets)
        self.eos = set(self.manifest.eos_token_ids) | set(self.generation_defaults.eos_token_ids)
        self.counters = EngineCounters()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = iter(range(1, 1 << 62))
        self._step_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        if config.background:
            self._thread = threading.Thread(target=self._loop, name="edgeprefill", daemon=True)
            self._thread.start()

    @classmethod
    def load(cls, bundle_dir: str | Path, **options) -> Engine:
        """`Engine.load(bundle, threads=2, kv_slots=4, policy="chunked+priority", ...)`:
        keyword options are EngineConfig fields or SchedulerConfig fields."""
        sched_fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
        sched = {k: options.pop(k) for k in list(options) if k in sched_fields}
        try:
            config = EngineConfig(scheduler=SchedulerConfig(**sched), **options)
        except TypeError as err:
            raise RequestError(f"unknown engine option: {err}") from None
        return cls(bundle_dir, config)

    def _capacity(self) -> int:
        limit = self.manifest.max_context
        wanted = self.config.max_context or limit
        if not 1 < wanted <= limit:
            raise RequestError(f"max_context must be in 2..{limit} for this bundle")
        return wanted

    def _slots(self) -> int:
        if self.config.kv_budget_bytes is None:
            return self.config.kv_slots
        per_slot = self.backend.kv_slot_bytes(self.capacity)
        slots = self.config.kv_budget_bytes // per_slot
        if slots < 1:
            raise RequestError(
                f"a KV budget of {self.config.kv_budget_bytes} bytes holds no slot of "
                f"{self.capacity} positions ({per_slot} bytes); raise it or lower max_context"
            )
        return int(slots)

    # -- public API (any thread) ------------------------------------------------------

    def session(self):
        from edgeprefill.sdk.session import Session

        return Session(self, next(self._ids))

    def generate(
        self, prompt: Prompt, params: GenerationParams | None = None, *,
        priority: int = 0, chunk_size: int | None = None,
    ) -> TokenStream:
        """One request outside any session: its KV stays only as a prefix-cache entry."""
        return self.submit(self.tokenizer.encode(prompt), params, priority, None, chunk_size)

    def submit(
        self, tokens: list[int], params: GenerationParams | None, priority: int,
        session_id: int | None, chunk_size: int | None = None,
    ) -> TokenStream:
        """Queue a request for token ids; raises RequestError at once if it can never run."""
        return self.submit_n(tokens, params, 1, priority, session_id, chunk_size)[0]

    def submit_n(
        self, tokens: list[int], params: GenerationParams | None, n: int, priority: int = 0,
        session_id: int | None = None, chunk_size: int | None = None,
    ) -> list[TokenStream]:
        """n completions of one prompt (OpenAI's `n`). The first prefills the prompt; the
        others then start decoding from a copy of its KV slot and its last logits (one
        prefill, n decodes; without a free slot one waits and borrows the prefix later).
        With a seed, choice i draws with seed + i, so the choices differ yet reproduce."""
        params = params or self.default_params()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError(f"n must be an integer >= 1, got {n!r}")
        self._admit_check(tokens, params, chunk_size)
        requests = [  # only the first keeps a session's slot
            self._request(tokens, _nth_seed(params, i), priority,
                          session_id if i == 0 else None, chunk_size) for i in range(n)]
        requests[0].followers = requests[1:]
        self._post("add", requests[0])
        return [r.stream for r in requests]

    def _request(
        self, tokens: list[int], params: GenerationParams, priority: int,
        session_id: int | None, chunk_size: int | None,
    ) -> Request:
        now = time.perf_counter()
        request_id = next(self._ids)
        metrics = RequestMetrics(arrival=now, prompt_tokens=len(tokens))
        pump = None if self._thread else self._pump
        request: Request
        stream = TokenStream(request_id, metrics, lambda: self._post("cancel", request), pump)
        request = Request(
            id=request_id, tokens=list(tokens), params=params, priority=int(priority),
            arrival=request_id, session_id=session_id, stream=stream,
            sampler=self._sampler(params, tokens), text=TextStreamer(self.tokenizer, params.stop),
            metrics=metrics, chunk_size=chunk_size,
        )
        return request

    def _sampler(self, params: GenerationParams, tokens: list[int]) -> Sampler:
        vocab = self.manifest.model.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise RequestError(f"logit_bias names token {max(params.logit_bias)}, "
                               f"outside the vocabulary [0, {vocab})")
        mask = None
        if params.constraint is not None:
            from edgeprefill.sdk.constraints import compile_constraint

            mask = compile_constraint(params.constraint, self.tokenizer, self.eos)
        return Sampler(params, tokens, mask)

    def default_params(self, **explicit) -> GenerationParams:
        """GenerationParams from the explicit non-None keyword values, the bundle's
        generation_config.json defaults for the sampling fields not given, and
        GenerationParams' own defaults for the rest."""
        given = {k: v for k, v in explicit.items() if v is not None}
        try:
            params = GenerationParams(**given)
        except TypeError as err:
            raise RequestError(f"unknown generation parameter: {err}") from None
        return self.generation_defaults.fill(params, given)

    def kv_forget(self, session_id: int) -> None:
        """A closed session's slot becomes a plain, evictable prefix entry."""
        with self._step_lock:
            self.kv.forget_owner(session_id)

    def metrics(self) -> EngineMetrics:
        c, usage = self.counters, self.kv.usage()
        return EngineMetrics(
            prefill_tokens=c.prefill_tokens, prefill_seconds=c.prefill_seconds,
            decode_tokens=c.decode_tokens, decode_seconds=c.decode_seconds,
            decode_steps=c.decode_steps, max_decode_stall_s=c.max_decode_stall_s,
            kv_slots=usage.slots, kv_active=usage.active, kv_retained=usage.retained,
            kv_tokens=usage.tokens, kv_bytes=usage.bytes_total,
            prefix_lookups=self.kv.prefix_lookups, prefix_hits=self.kv.prefix_hits,
            queue_depth=self.scheduler.queue_depth,
            running=len(self.scheduler.decoding) + len(self.scheduler.waiting),
            finished=c.finished,
        )

    def check_integrity(self) -> None:
        """Assert that the KV bookkeeping matches the live requests."""
        with self._step_lock:
            live = self.scheduler.waiting + self.scheduler.decoding
            self.kv.check_integrity({r.slot: r for r in live if r.slot is not None})

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._step_lock:
            for request in self.scheduler.waiting + self.scheduler.decoding:
                self._finish(request, "cancelled", keep=False)
            self._drain_inbox()
            self.backend.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the step loop ----------------------------------------------------------------

    def step(self) -> bool:
        """Run one scheduling step; returns False when there was nothing to do."""
        with self._step_lock:
            self._drain_inbox()
            plan = self.scheduler.schedule()
            if plan.empty:
                return False
            if plan.decode:
                self._guarded(plan.decode, self._decode)
            if plan.prefill:
                self._guarded([plan.prefill.request], lambda _: self._prefill(plan.prefill))
            if not self.scheduler.decoding:
                self.counters.last_decode_end = None  # nobody is waiting for a token
            return True

    def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            if not self.step():
                self._wake.wait(0.1)

    def _pump(self) -> None:
        if not self.step():
            time.sleep(0.001)

    def _post(self, kind: str, request: Request) -> None:
        self._inbox.put((kind, request))
        self._wake.set()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, request = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and not request.cancelled:
                self._add(request)
            elif kind == "cancel" and request.phase is not Phase.DONE:
                request.cancelled = True
                self._finish(request, "cancelled", keep=False)

    def _add(self, request: Request) -> None:
        try:
            self.scheduler.add(request)
        except RequestError as err:
            self._finish(request, "error", keep=False, error=str(err))

    def _fork_followers(self, request: Request, logits: np.ndarray) -> None:
        """The n > 1 siblings of a request whose prompt just entered the KV cache start
        decoding from a copy of its KV and its last logits: one prefill for n choices.
        Without a free slot a sibling waits in the queue and borrows the prefix later."""
        followers, request.followers = request.followers, []
        for follower in followers:
            if follower.cancelled:
                continue
            slot = self.kv.fork(request.slot)
            if slot is None:
                self._add(follower)
                continue
            follower.slot, follower.kv_len = slot, len(follower.tokens)
            follower.metrics.prefix_reused = follower.kv_len
            self.scheduler.waiting.append(follower)  # past admission: its parent's
            self.scheduler.to_decode(follower)
            self._emit(follower, logits)

    def _start_followers(self, request: Request, ended: str | None = None) -> None:
        """Queue the n > 1 siblings of a request that `ended` before its prompt was in the
        KV cache: they run alone, or are cancelled with it."""
        followers, request.followers = request.followers, []
        for follower in followers:
            if ended == "cancelled" or self._stopping:
                self._finish(follower, "cancelled", keep=False)
            elif not follower.cancelled:
                self._add(follower)

    def _guarded(self, requests: list[Request], run) -> None:
        # A failing step ends the requests it carried, never the loop or other requests.
        try:
            run(requests)
        except Exception as err:  # noqa: BLE001 - reported to each request's stream
            for request in requests:
                if request.phase is not Phase.DONE:
                    self._finish(request, "error", keep=False, error=f"{type(err).__name__}: {err}")

    def _decode(self, requests: list[Request]) -> None:
        self._remap(self.kv.compact([r.slot for r in requests]))
        requests = sorted(requests, key=lambda r: r.slot)
        last = [r.generated[-1] for r in requests]
        batch = StepBatch(
            input_ids=np.array(last, np.int64)[:, None],
            past_lens=np.array([r.kv_len for r in requests], np.int32),
            valid_lens=np.ones(len(requests), np.int32),
            first_slot=requests[0].slot,
        )
        start = time.perf_counter()
        logits = self.backend.run(batch)
        end = time.perf_counter()
        self._count_decode(len(requests), start, end)
        self._record("decode", start, end, requests, len(requests))
        for request, token, row in zip(requests, last, logits, strict=True):
            self.kv.extend(request.slot, [token])
            request.kv_len += 1
            self._emit(request, row)

    def _count_decode(self, rows: int, start: float, end: float) -> None:
        c = self.counters
        c.decode_tokens += rows
        c.decode_seconds += end - start
        c.decode_steps += 1
        if c.last_decode_end is not None:
            c.max_decode_stall_s = max(c.max_decode_stall_s, end - c.last_decode_end)
        c.last_decode_end = end
        self.scheduler.chunks.observe_decode(end - start)

    def _prefill(self, chunk: PrefillChunk) -> None:
        request, start, length = chunk
        ids = request.tokens[start : start + length]
        batch = StepBatch(
            input_ids=np.array([ids], np.int64),
            past_lens=np.array([start], np.int32),
            valid_lens=np.array([length], np.int32),
            first_slot=request.slot,
        )
        began = time.perf_counter()
        logits = self.backend.run(batch)
        ended = time.perf_counter()
        seconds = ended - began
        self._record("prefill", began, ended, [request], length)
        self.counters.prefill_tokens += length
        self.counters.prefill_seconds += seconds
        self.scheduler.chunks.observe_prefill(length, seconds)
        self.kv.extend(request.slot, ids)
        request.kv_len += length
        request.metrics.chunks += 1
        if request.prefill_left == 0:
            self.scheduler.to_decode(request)
            self._fork_followers(request, logits[0])
            self._emit(request, logits[0])

    def _record(
        self, kind: str, start: float, end: float, requests: list[Request], tokens: int
    ) -> None:
        if self.config.trace:
            ids = tuple(r.id for r in requests)
            self.trace.append(StepTrace(kind, start, end, ids, tokens))

    def _remap(self, moved: dict[int, int]) -> None:
        if moved:
            for request in self.scheduler.waiting + self.scheduler.decoding:
                if request.slot in moved:
                    request.slot = moved[request.slot]

    # -- tokens out -------------------------------------------------------------------

    def _emit(self, request: Request, logits: np.ndarray) -> None:
        sampled = request.sampler.choose(logits)
        token = sampled.token
        request.metrics.token_times.append(time.perf_counter())
        if token in self.eos and not request.params.ignore_eos:
            request.stream.eos_token_id = token
            self._finish(request, "stop")
            return
        request.generated.append(token)
        text = request.text.push(token)
        reason = self._finish_reason(request)
        if reason is not None and not request.text.stopped:
            text += request.text.flush()
        request.stream._put(TokenEvent(token, text, *self._logprobs(sampled)))
        if reason is not None:
            self._finish(request, reason)

    def _logprobs(self, sampled: Sampled) -> tuple[float | None, list | None, str | None]:
        if sampled.logprob is None:
            return None, None, None
        text = self.tokenizer.token_text
        top = [(t, text(t), lp) for t, lp in sampled.top or ()]
        return sampled.logprob, top, text(sampled.token)

    def _finish_reason(self, request: Request) -> str | None:
        if request.text.stopped or request.sampler.finished:
            return "stop"
        total = len(request.tokens) + len(request.generated)
        if request.max_total is not None and total >= request.max_total:
            return "length"
        if request.kv_len + 1 > self.capacity:  # no room for the next token's KV
            return "length"
        return None

    def _finish(
        self, request: Request, reason: str, keep: bool = True, error: str | None = None
    ) -> None:
        if request.phase is Phase.DONE:
            return
        self._start_followers(request, reason)
        tail = "" if request.text.stopped or reason == "cancelled" else request.text.flush()
        if tail:
            request.stream._put(TokenEvent(None, tail))
        self.scheduler.remove(request)
        request.phase = Phase.DONE
        if request.slot is not None:
            self.kv.release(request.slot, keep=keep)
        request.metrics.finish_reason = reason
        self.counters.finished += 1
        request.stream._finish(reason, error)

    def _admit_check(
        self, tokens: list[int], params: GenerationParams, chunk_size: int | None
    ) -> None:
        if self._stopping:
            raise EngineClosedError("the engine is closed")
        if not tokens:
            raise RequestError("the prompt is empty")
        if chunk_size is not None and chunk_size < 1:
            raise RequestError(f"chunk size must be >= 1, got {chunk_size}")
        wanted = len(tokens) + (params.max_new_tokens or 1)
        if wanted > self.capacity:
            raise RequestError(
                f"prompt ({len(tokens)} tokens) + max_new_tokens "
                f"({params.max_new_tokens}) exceeds the context of {self.capacity} tokens"
            )
