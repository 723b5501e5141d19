"""The engine: a bundle on a backend, one KV cache, one step loop.

    step = schedule -> decode call -> prefill chunk call -> sample -> stream

The scheduler decides what runs and moves requests between its groups; the step runner
(`step_runner.py`) builds each call's batch and keeps the books; this class owns the
threads, the inbox, sampling and the streams.

Callers on any thread submit requests and cancellations through an inbox; only the step
loop (a background thread, or whoever calls `step()`) touches the scheduler, the KV
cache and the backend.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeprefill.bundle import Manifest, load_manifest
from edgeprefill.engines import BackendOptions, create_backend
from edgeprefill.errors import (
    BackendError,
    EdgeprefillError,
    EngineClosedError,
    RequestError,
    SettingError,
    one_line,
)
from edgeprefill.sdk import embedding, scoring
from edgeprefill.sdk.config import EngineConfig, StepTrace
from edgeprefill.sdk.generation_defaults import GenerationDefaults
from edgeprefill.sdk.known_fields import unknown_message
from edgeprefill.sdk.kv_cache import KVCache
from edgeprefill.sdk.metrics import EngineCounters, EngineMetrics, RequestMetrics
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.priority import parse_priority
from edgeprefill.sdk.request import Phase, Request
from edgeprefill.sdk.sampler import Sampled, Sampler
from edgeprefill.sdk.scheduler import PrefillChunk, Scheduler, SchedulerConfig, StepPlan
from edgeprefill.sdk.state_snapshots import snapshot_budget
from edgeprefill.sdk.step_runner import StepRunner
from edgeprefill.sdk.stream import TokenEvent, TokenStream
from edgeprefill.sdk.tokenizer import BundleTokenizer, Prompt, TextStreamer
from edgeprefill.values import is_int, is_integral, plain

if TYPE_CHECKING:
    from edgeprefill.sdk.session import Session

log = logging.getLogger("edgeprefill")
# OpenAI's limit on n. Each choice is a request of its own, built before any runs, and
# the choices wait past the queue's limit (they share an admitted prompt): n=10**6 had
# held its caller for minutes.
MAX_CHOICES = 128


def _nth_seed(params: GenerationParams, i: int) -> GenerationParams:
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + i)


class Engine:
    def __init__(self, bundle_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        # The path as given: load_manifest refuses "" (which Path() would make ".").
        self.manifest: Manifest = load_manifest(bundle_dir, config.verify_checksums)
        self.bundle_dir = Path(bundle_dir)
        self.tokenizer = BundleTokenizer(self.bundle_dir, self.manifest)
        score = self.manifest.score  # a score bundle's head, applied to its hidden rows
        self.score_head = None if score is None else \
            scoring.ScoreHead.load(self.bundle_dir, score, self.manifest.model.hidden_size)
        self.generation_defaults = GenerationDefaults.load(self.bundle_dir)
        options = BackendOptions(device=config.device, threads=config.threads, spin=config.spin,
                                 compute=config.compute)
        self.backend = create_backend(config.backend, self.bundle_dir, self.manifest, options)
        self.capacity = self._capacity()
        buckets = list(self.manifest.chunks)
        self.kv = self._allocate_kv(align=buckets[0])
        self.trace: list[StepTrace] = []
        self.scheduler = Scheduler(config.scheduler, self.kv, buckets,
                                   backend_fuses=self.backend.fuses_rows)
        if config.scheduler.fuse_steps and not self.backend.fuses_rows:
            log.warning("fuse steps: a prefill chunk and the decode rows run in two calls "
                        "here: %s", self.backend.why_not_fused)
        self.eos = set(self.manifest.eos_token_ids) | set(self.generation_defaults.eos_token_ids)
        self.counters = EngineCounters()
        self.runner = StepRunner(self.backend, self.kv, self.scheduler.chunks, self.counters,
                                 self.trace if config.trace else None)
        self._inbox: queue.SimpleQueue[tuple[str, Request]] = queue.SimpleQueue()
        self._ids = iter(range(1, 1 << 62))
        # The sessions handed out and still held: a submit() may name only one of them.
        self._sessions: weakref.WeakValueDictionary[int, Session] = \
            weakref.WeakValueDictionary()
        self._step_lock = threading.Lock()
        self._admission = threading.Lock()  # orders submit() against close()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start()
        # Like an unclosed file: a ResourceWarning (shown by pytest and `python -X dev`).
        self._unclosed = weakref.finalize(self, _warn_unclosed, str(self.bundle_dir))
        self._unclosed.atexit = False

    def _allocate_kv(self, align: int) -> KVCache:
        """The KV cache of `_slots()` sequences; where it does not fit or cannot be
        allocated, the backend is closed and the refusal raised."""
        try:
            slots = self._slots()
            self._check_kv_fits(slots)
            return KVCache(
                self.backend, slots, self.capacity, align=align,
                share_prefixes=self.config.prefix_reuse,
            )
        except (RequestError, MemoryError) as err:
            self.backend.close()  # the session's memory goes back now, not at collection
            if isinstance(err, MemoryError):
                raise self._kv_too_big(slots, "could not be allocated") from None
            raise

    def _start(self) -> None:
        """The background step loop, warmed up before this returns (its warm-up's error
        raised here), or the warm-up on this thread (EngineConfig.background, warm_up)."""
        if self.config.background:
            warmed = threading.Event()
            self._warm_up_error: BaseException | None = None
            # The loop holds the engine weakly between steps: an Engine dropped without
            # close() is collected (its KV cache and backend session freed) and the
            # thread ends, instead of the thread keeping both alive for good.
            self._thread = threading.Thread(target=_step_loop,
                                            args=(weakref.ref(self), self._wake, warmed),
                                            name="edgeprefill", daemon=True)
            self._thread.start()
            warmed.wait()
            if self._warm_up_error is not None:
                raise self._warm_up_error
        elif self.config.warm_up:
            self._warm_up()

    @classmethod
    def load(cls, bundle_dir: str | Path, **options: Any) -> Engine:
        """`Engine.load(bundle, threads=2, kv_slots=4, policy="chunked+priority", ...)`:
        keyword options are EngineConfig fields or SchedulerConfig fields."""
        if "scheduler" in options:
            raise RequestError("give the scheduler's fields (policy=, chunk_size=, ...) as "
                               "keyword options, not scheduler=")
        sched_fields = [f.name for f in dataclasses.fields(SchedulerConfig)]
        engine_fields = [f.name for f in dataclasses.fields(EngineConfig)
                         if f.name != "scheduler"]
        unknown = [k for k in options if k not in engine_fields + sched_fields]
        if unknown:
            raise RequestError(unknown_message("Engine.load", unknown,
                                               engine_fields + sched_fields, "option"))
        sched = {k: options.pop(k) for k in list(options) if k in sched_fields}
        config = EngineConfig(scheduler=SchedulerConfig(**sched), **options)
        return cls(bundle_dir, config)

    def _warm_up(self) -> None:
        """StepRunner.warm_up with the largest chunk the scheduler sends. A call that fails
        here would fail the first request: the load fails instead, in one line."""
        chunk = self.config.scheduler.chunk_size or max(self.manifest.chunks)
        try:
            self.runner.warm_up(min(chunk, self.capacity))
        except Exception as err:
            self.backend.close()
            if isinstance(err, EdgeprefillError):
                raise
            raise BackendError(f"the backend failed its first call (the load's warm-up): "
                               f"{one_line(err)}") from err

    def _capacity(self) -> int:
        limit = self.manifest.max_context
        wanted = limit if self.config.max_context is None else self.config.max_context
        if not 1 < wanted <= limit:
            raise RequestError(f"max_context must be in 2..{limit} for this bundle",
                               "max_context")
        return wanted

    def _slots(self) -> int:
        if self.config.kv_budget_bytes is None:
            return self.config.kv_slots
        per_slot = self._slot_bytes()
        slots = self.config.kv_budget_bytes // per_slot
        if slots < 1:
            raise RequestError(
                f"a KV budget of {self.config.kv_budget_bytes} bytes holds no slot of "
                f"{self.capacity} positions ({per_slot} bytes); raise it or lower max_context"
            )
        return int(slots)

    def _slot_bytes(self) -> int:
        """One slot's KV and state, and the most its state snapshots may take."""
        return (self.backend.kv_slot_bytes(self.capacity)
                + snapshot_budget(self.backend, self.capacity, self.manifest.chunks[0]))

    def _check_kv_fits(self, slots: int) -> None:
        """A KV cache larger than the machine's memory is refused before it is allocated
        (numpy would raise MemoryError, or the system would start swapping)."""
        if self.config.device != "cpu":
            return  # device memory: the backend's allocation says
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, OSError, ValueError):  # no sysconf (Windows)
            return
        if slots * self._slot_bytes() > ram:
            raise self._kv_too_big(slots, f"exceed this machine's {ram / 2**30:.1f} GiB "
                                          "of memory")

    def _kv_too_big(self, slots: int, what: str) -> SettingError:
        total = slots * self._slot_bytes()
        return SettingError(f"{slots} KV slots of {self.capacity} positions "
                            f"({total / 2**30:.1f} GiB) {what}", ("kv_slots", "max_context"),
                            ", or give kv_budget_bytes")

    # -- public API (any thread) ------------------------------------------------------

    def session(self) -> Session:
        from edgeprefill.sdk.session import Session

        session = Session(self, next(self._ids))
        self._sessions[session.id] = session
        return session

    def generate(
        self, prompt: Prompt, params: GenerationParams | None = None, *,
        priority: int | str = 0, chunk_size: int | None = None,
    ) -> TokenStream:
        """One request outside any session: its KV stays only as a prefix-cache entry.
        `priority`: lower is served first (vLLM's meaning); `high`/`normal`/`low` too.
        Its TTFT counts from this call, tokenizing the prompt included. An empty text, or
        one the tokenizer reads as no token (whitespace it drops), is refused (it would run
        the BOS alone), as the completions route refuses it."""
        arrival = time.perf_counter()
        if isinstance(prompt, str) and not prompt:
            raise RequestError("the prompt is empty")
        tokens = self.tokenizer.encode(prompt)
        if isinstance(prompt, str) and self.tokenizer.encodes_nothing(prompt, tokens):
            raise RequestError("the prompt is empty (its whitespace is no token)")
        return self.submit(tokens, params, priority, None, chunk_size, arrival=arrival)

    def submit(
        self, tokens: list[int], params: GenerationParams | None, priority: int | str,
        session_id: int | None, chunk_size: int | None = None, *,
        arrival: float | None = None,
    ) -> TokenStream:
        """Queue a request for token ids; raises RequestError at once if it can never run.
        `arrival`: when the request came (time.perf_counter(), default now), from which its
        TTFT and queue time count."""
        return self.submit_n(tokens, params, 1, priority, session_id, chunk_size,
                             arrival=arrival)[0]

    def submit_n(
        self, tokens: list[int], params: GenerationParams | None, n: int,
        priority: int | str = 0,
        session_id: int | None = None, chunk_size: int | None = None, *,
        arrival: float | None = None,
    ) -> list[TokenStream]:
        """n completions of one prompt (OpenAI's `n`). The first prefills the prompt; the
        others then start decoding from a copy of its KV slot and its last logits (one
        prefill, n decodes; without a free slot one waits and borrows the prefix later).
        With a seed, choice i draws with seed + i, so the choices differ yet reproduce."""
        if self.manifest.task != "generate":
            raise RequestError(self._not_generating())
        params = self.default_params() if params is None else params
        if not isinstance(params, GenerationParams):  # a dict of its fields, most likely
            raise RequestError(f"params must be a GenerationParams, got "
                               f"{type(params).__name__} (GenerationParams(**fields) makes one)")
        count = plain(n)  # numpy's integers too
        if not is_int(count) or not 1 <= count <= MAX_CHOICES:
            raise RequestError(f"n must be an integer in 1..{MAX_CHOICES}, got {n!r}")
        if session_id is not None and session_id not in self._sessions:
            raise RequestError(f"unknown session id {session_id!r}: a session_id is the id "
                               "of a Session from this engine's session()")
        tokens = _token_list(tokens)
        self._check_request(tokens, params, chunk_size)
        tokens = [int(t) for t in tokens]  # numpy integers too, once they are checked
        chunk_size = None if chunk_size is None else int(chunk_size)
        requests = [  # only the first keeps a session's slot
            self._request(tokens, _nth_seed(params, i), parse_priority(priority),
                          session_id if i == 0 else None, chunk_size, arrival)
            for i in range(count)]
        requests[0].followers = requests[1:]
        with self._admission:  # after close() has started, nothing new enters the inbox
            if self._stopping:
                raise EngineClosedError("the engine is closed")
            self._post("add", requests[0])
        return [r.stream for r in requests]

    def embed(self, texts: str | list[str], *, dimensions: int | None = None,
              prompt_name: str | None = None, prompt: str | None = None,
              priority: int | str = 0) -> np.ndarray:
        """float32 [len(texts), hidden] (or [.., dimensions]: the first `dimensions` of
        each, a Matryoshka truncation) embeddings of an embedding bundle's model, one row
        per text, L2-normalized where the bundle normalizes. A text is tokenized as
        sentence-transformers does (sdk/embedding.py), prefilled in chunks as a prompt is,
        between other requests' steps; one longer than the context is refused. Blocks
        until every vector is there.

        `prompt_name` puts one of the model's named prompts before each text (Qwen3-
        Embedding's "query" for a search query; `inspect` lists them), `prompt` a text of
        your own; with neither, the model's default prompt, if its folder named one, as
        sentence-transformers' `encode` does."""
        items = [texts] if isinstance(texts, str) else texts
        if not isinstance(items, list | tuple) or not items:
            raise RequestError("texts must be a string or a non-empty list of strings")
        dimensions = self._embedding_dimensions(dimensions)
        before = embedding.prompt_of(self.manifest.embedding, prompt_name, prompt)
        ids = [_indexed(i if len(items) > 1 else None, embedding.prompted_ids, self.tokenizer,
                        before, text, self.capacity) for i, text in enumerate(items)]
        rows = self._embed_rows(ids, priority)
        return embedding.vectors(np.stack(rows), embedding.normalizes(self.manifest),
                                 dimensions)

    def _not_generating(self) -> str:
        """The refusal of a generation call on an embedding or score bundle."""
        if self.manifest.task == "score":
            return scoring.score_only(self.manifest)
        return embedding.embedding_only(self.manifest)

    def _embedding_dimensions(self, dimensions: object) -> int | None:
        if self.manifest.task == "score":
            raise RequestError(scoring.score_only(self.manifest))
        if self.manifest.task != "embed":
            raise RequestError(embedding.generation_only(self.manifest))
        return embedding.check_dimensions(dimensions, self.manifest.model.hidden_size)

    def _embed_rows(self, ids: list[list[int]], priority: int | str) -> list[np.ndarray]:
        """The hidden rows of several prompts, a window of them in the engine at a time
        (as many as its KV slots, twice: the queue stays short for other callers)."""
        window = 2 * len(self.kv.slots)
        streams: list[TokenStream] = []
        rows: list[np.ndarray] = []
        try:
            for i, tokens in enumerate(ids):
                streams.append(self.submit_embedding(tokens, priority=priority))
                if i + 1 >= window:
                    rows.append(embedding.row_of(streams[len(rows)].result()))
            rows += [embedding.row_of(stream.result()) for stream in streams[len(rows):]]
        finally:
            for stream in streams[len(rows):]:
                stream.cancel()  # a refusal part way: the rest would run for nobody
        return rows

    def score(self, texts: scoring.Item | list[scoring.Item], *,
              priority: int | str = 0) -> np.ndarray:
        """float32 [len(texts), labels]: a score bundle's raw head outputs (a classifier's
        logits, a reward model's reward, a token reranker's logits of its tokens), one row
        per text. A text is a string, read as it is (a reward model's rendered
        conversation), or a (query, document) pair, read as the bundle reads pairs
        (sdk/scoring.py). Each is prefilled in chunks as a prompt is, between other
        requests' steps; one longer than the context is refused. Blocks until done."""
        head = self._score_head()
        items = [texts] if isinstance(texts, str | tuple) else texts
        if not isinstance(items, list) or not items:
            raise RequestError("texts must be a string, a (query, document) pair, or a "
                               "non-empty list of them")
        ids = [_indexed(i if len(items) > 1 else None, scoring.item_ids, self.tokenizer,
                        head.info, item, self.capacity) for i, item in enumerate(items)]
        return head.scores(np.stack(self._embed_rows(ids, priority)))

    def rerank(self, query: str, documents: list[str], *, top_n: int | None = None,
               priority: int | str = 0) -> list[tuple[int, float]]:
        """(index, relevance) of each document for `query`, best first (ties in input
        order), the first `top_n` only where given: each pair scored by a score bundle
        (Engine.score), its head outputs made one relevance in 0..1 (sdk/scoring.py:
        sigmoid of one label, sigmoid(yes - no) of a token pair)."""
        head = self._score_head()
        if not isinstance(query, str) or not query:  # as the rerank route refuses it
            got = repr(query) if isinstance(query, str) else type(query).__name__
            raise RequestError(f"query must be a non-empty string, got {got}")
        if not isinstance(documents, list | tuple) or not documents or \
                not all(isinstance(d, str) for d in documents):
            raise RequestError("documents must be a non-empty list of strings")
        top = scoring.top_n(top_n)
        head.check_ranks()
        scores = self.score([(query, d) for d in documents], priority=priority)
        return scoring.ranked(head.relevance(scores), top)

    def _score_head(self) -> scoring.ScoreHead:
        if self.score_head is None:
            raise RequestError(scoring.scoring_only(self.manifest))
        return self.score_head

    def submit_embedding(self, tokens: list[int], *, priority: int | str = 0,
                         arrival: float | None = None) -> TokenStream:
        """Queue one embedding request for token ids (an embedding or score bundle's):
        its stream streams no events and ends with "stop" once the prompt is prefilled,
        its `embedding` then the hidden state of the last token (float32 [hidden], neither
        normalized nor truncated: sdk/embedding.vectors; a score bundle's head is applied
        by Engine.score). The whole context may be prompt: nothing is generated after it."""
        if self.manifest.task == "generate":
            raise RequestError(embedding.generation_only(self.manifest))
        tokens = _token_list(tokens)
        if self._stopping:
            raise EngineClosedError("the engine is closed")
        if not tokens:
            raise RequestError("the text to embed is empty (no tokens)")
        self._check_ids(tokens)
        if len(tokens) > self.capacity:
            raise RequestError(f"a text of {len(tokens)} tokens exceeds the context of "
                               f"{self.capacity} tokens")
        tokens = [int(t) for t in tokens]
        request = self._request(tokens, GenerationParams(), parse_priority(priority), None,
                                None, arrival)
        request.embeds = True
        with self._admission:
            if self._stopping:
                raise EngineClosedError("the engine is closed")
            self._post("add", request)
        return request.stream

    def _request(
        self, tokens: list[int], params: GenerationParams, priority: int,
        session_id: int | None, chunk_size: int | None, arrival: float | None = None,
    ) -> Request:
        now = time.perf_counter() if arrival is None else arrival
        request_id = next(self._ids)
        metrics = RequestMetrics(arrival=now, prompt_tokens=len(tokens))
        pump = None if self._thread else self._pump
        request: Request
        stream = TokenStream(request_id, metrics, lambda: self._post("cancel", request), pump)
        request = Request(
            id=request_id, tokens=list(tokens), params=params, priority=priority,
            arrival=request_id, session_id=session_id, stream=stream,
            sampler=self._sampler(params, tokens), text=TextStreamer(self.tokenizer, params.stop),
            metrics=metrics, chunk_size=chunk_size,
        )
        return request

    def _sampler(self, params: GenerationParams, tokens: list[int]) -> Sampler:
        vocab = self.manifest.model.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise RequestError(f"logit_bias names token {max(params.logit_bias)}, "
                               f"outside the vocabulary [0, {vocab})", "logit_bias")
        mask = None
        if params.constraint is not None:
            from edgeprefill.sdk.constraints import compile_constraint
            from edgeprefill.sdk.thinking_budget import ids_open_think

            try:
                opened = params.constraint.after_thinking and \
                    ids_open_think(self.tokenizer, tokens)
                mask = compile_constraint(params.constraint, self.tokenizer, sorted(self.eos),
                                          opened)
            except RequestError as err:  # a grammar that does not compile, a tokenizer
                raise RequestError(str(err), "constraint") from None
        budget = None
        if params.thinking_budget is not None:
            from edgeprefill.sdk.thinking_budget import thinking_budget

            budget = thinking_budget(params.thinking_budget, self.tokenizer, tokens)
        return Sampler(params, tokens, mask, budget)

    def default_params(self, **explicit: Any) -> GenerationParams:
        """GenerationParams from the explicit non-None keyword values, the bundle's
        generation_config.json defaults for the sampling fields not given, and
        GenerationParams' own defaults for the rest."""
        given = {k: v for k, v in explicit.items() if v is not None}
        # No max_new_tokens of the caller's: the default is a cap the context may cut, not
        # a promise that refuses a long prompt (as `edgeprefill run` without the option).
        given.setdefault("fit_context", "max_new_tokens" not in given)
        params = GenerationParams(**given)  # an unknown keyword is its RequestError
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
            running=self.scheduler.running,
            finished=c.finished,
            fused_steps=c.fused_steps, prefill_steps=c.prefill_steps,
            prefill_rows=c.prefill_rows,
        )

    def check_integrity(self) -> None:
        """Assert that the KV bookkeeping matches the live requests."""
        with self._step_lock:
            live = self.scheduler.live()
            self.kv.check_integrity({r.slot: r for r in live if r.slot is not None})

    def close(self) -> None:
        """Stop the step loop and end every stream this engine knows, queued, prefilling
        or decoding, with `cancelled`: no reader blocks after close(). Idempotent."""
        with self._admission:
            if self._closed:
                return
            self._stopping = True
        self._unclosed.detach()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._step_lock:
            if self._closed:  # a concurrent close() got here first
                return
            self._drain_inbox()  # requests submitted just before close() enter, then end
            for request in self.scheduler.live():
                self._finish(request, "cancelled", keep=False)
            self.kv.drop_snapshots()
            self.backend.close()
            self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the step loop ----------------------------------------------------------------

    def step(self) -> bool:
        """Run one scheduling step; returns False when there was nothing to do."""
        with self._step_lock:
            self._drain_inbox()
            plan = self._plan()
            if plan is None or plan.empty:
                if not self.scheduler.decoding:
                    self.runner.idle()  # a cancel emptied it: the idle time is no stall
                return plan is None
            chunks = plan.prefill
            if plan.fused:
                self._guarded([*plan.decode, *(c.request for c in chunks)],
                              lambda _: self._fused(plan.decode, chunks))
            else:
                if plan.decode:
                    self._guarded(plan.decode, self._decode)
                if chunks:  # one: prompts share a step only in one (fused) call
                    chunk = chunks[0]
                    self._guarded([chunk.request], lambda _: self._prefill(chunk))
            if not self.scheduler.decoding:
                self.runner.idle()  # nobody is waiting for a token
            return True

    def _plan(self) -> StepPlan | None:
        """The scheduler's plan; None if planning failed (a KV copy or swap on the
        backend), which ends the requests holding slots, never the loop."""
        try:
            return self.scheduler.schedule()
        except Exception as err:  # noqa: BLE001 - reported to each request's stream
            holding = [r for r in self.scheduler.live() if r.slot is not None]
            self._fail(holding, err)
            return None

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

    def _add(self, request: Request, admitted: bool = False) -> None:
        try:
            self.scheduler.add(request, admitted)
        except RequestError as err:
            # A refused request's n > 1 siblings share its refusal (admitted, they would
            # run past the queue's limit).
            refused, request.followers = request.followers, []
            for each in (request, *refused):
                self._finish(each, "error", keep=False, error=str(err))

    def _fork_followers(self, request: Request, logits: np.ndarray) -> None:
        """The n > 1 siblings of a request whose prompt just entered the KV cache start
        decoding from a copy of its KV and its last logits: one prefill for n choices.
        Without a free slot a sibling waits in the queue and borrows the prefix later."""
        followers, request.followers = request.followers, []
        for follower in followers:
            if follower.cancelled:
                continue
            # A failed copy (the backend's) ends that sibling alone, not the step's
            # requests; the slot it was taking stays free and empty.
            try:
                slot = self.kv.fork(_slot(request))
            except Exception as err:  # noqa: BLE001 - reported to the sibling's stream
                self._fail([follower], err)
                continue
            if slot is None:
                follower.copies_prompt = True  # it goes first, before the KV is evicted
                self._add(follower, admitted=True)
                continue
            follower.slot, follower.kv_len = slot, len(follower.tokens)
            follower.metrics.prefix_reused = follower.kv_len
            self.scheduler.adopt(follower)  # past admission: its parent's
            self._emit_own(follower, logits)  # its failure ends it alone

    def _start_followers(self, request: Request, ended: str | None = None) -> None:
        """Queue the n > 1 siblings of a request that `ended` before its prompt was in the
        KV cache (cancelled, or failed): they run alone, as they would had it ended after.
        A closing engine cancels them with it."""
        followers, request.followers = request.followers, []
        for follower in followers:
            if self._stopping:
                self._finish(follower, "cancelled", keep=False)
            elif not follower.cancelled:
                self._add(follower, admitted=True)

    def _guarded(self, requests: list[Request], run: Callable[[list[Request]], None]) -> None:
        # A failing step ends the requests it carried, never the loop or other requests.
        try:
            run(requests)
        except Exception as err:  # noqa: BLE001 - reported to each request's stream
            self._fail(requests, err)

    def _fail(self, requests: list[Request], err: Exception) -> None:
        # A RequestError is the request's own doing, said in its own words.
        if isinstance(err, RequestError):
            error, field = str(err), err.field
        else:
            error, field = f"{type(err).__name__}: {err}", None
        for request in requests:
            if request.phase is not Phase.DONE:
                self._finish(request, "error", keep=False, error=error, field=field)

    def _decode(self, rows: list[Request]) -> None:
        self._emit_rows(rows, self.runner.decode(rows))

    def _emit_rows(self, rows: list[Request], logits: np.ndarray) -> None:
        for request, row in zip(rows, logits, strict=True):
            self._emit_own(request, row)

    def _prefill(self, chunk: PrefillChunk) -> None:
        self._prefilled(chunk.request, self.runner.prefill(chunk))

    def _fused(self, rows: list[Request], chunks: list[PrefillChunk]) -> None:
        decoded, prefilled = self.runner.fused(rows, chunks)
        self._emit_rows(rows, decoded)
        for chunk, logits in zip(chunks, prefilled, strict=True):
            self._prefilled(chunk.request, logits)

    def _prefilled(self, request: Request, logits: np.ndarray) -> None:
        """After a chunk of `request`'s prompt: its first token once the whole prompt is in
        (an embedding request's end: its last token's hidden state)."""
        if request.prefill_left == 0 and request.embeds:
            request.stream.embedding = logits[0].copy()  # the backend reuses its buffer
            self._finish(request, "stop")  # its KV stays as a prefix-cache entry
        elif request.prefill_left == 0:
            self.scheduler.prefilled(request)
            self._fork_followers(request, logits[0])
            self._emit_own(request, logits[0])

    # -- tokens out -------------------------------------------------------------------

    def _emit_own(self, request: Request, logits: np.ndarray) -> None:
        """_emit, whose failure (the request's own constraint, sampler or detokenizer) ends
        that request alone: the others of its step got their logits and go on."""
        try:
            self._emit(request, logits)
        except Exception as err:  # noqa: BLE001 - reported to the request's stream
            self._fail([request], err)

    def _emit(self, request: Request, logits: np.ndarray) -> None:
        sampled = request.sampler.choose(logits)
        token = sampled.token
        request.metrics.token_times.append(time.perf_counter())
        if token in self.eos and not request.params.ignore_eos:
            request.stream.eos_token_id = token
            request.metrics.ended_on_eos = True
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

    def _logprobs(
        self, sampled: Sampled,
    ) -> tuple[float | None, list[tuple[int, str, float]] | None, str | None]:
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
        # The context holds prompt + reply (as submit checks it, and as OpenAI and vLLM
        # count it): the reply ends as its total reaches it, although its last token
        # would need no KV position.
        if total >= self.capacity:
            return "length"
        return None

    def _finish(
        self, request: Request, reason: str, keep: bool = True, error: str | None = None,
        field: str | None = None,
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
        request.stream.stop_string = request.text.stop_string
        request.stream._finish(reason, error, field)

    def _check_request(
        self, tokens: list[int], params: GenerationParams, chunk_size: int | None
    ) -> None:
        if self._stopping:
            raise EngineClosedError("the engine is closed")
        if not tokens:
            raise RequestError("the prompt is empty")
        self._check_ids(tokens)
        if chunk_size is not None:
            if not is_integral(chunk_size) or chunk_size < 1:
                raise RequestError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")

        room = 1 if params.fit_context or params.max_new_tokens is None \
            else params.max_new_tokens
        if len(tokens) + room > self.capacity:
            asked = "one new token" if room == 1 else f"max_new_tokens ({room})"
            raise RequestError(f"prompt ({len(tokens)} tokens) + {asked} exceeds the context "
                               f"of {self.capacity} tokens",
                               None if room == 1 else "max_new_tokens")

    def _check_ids(self, tokens: list[int]) -> None:
        vocab = self.manifest.model.input_vocab_size  # the embedding's rows
        bad = next((t for t in tokens if not is_integral(t) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad!r} is not in the vocabulary (ids 0..{vocab - 1})")


def _indexed(index: int | None, read: Callable[..., list[int]], *args: Any) -> list[int]:
    """A text's ids, read(*args); a refusal names the text's place in the list (embed's
    and score's `texts`), if one was given."""
    try:
        return read(*args)
    except RequestError as err:
        if index is None:
            raise
        raise RequestError(f"texts[{index}]: {err}") from None


def _token_list(tokens: object) -> list[Any]:
    """Token ids as a list, from any sequence, array or iterator (_check_ids then checks
    each); anything else is a RequestError, not a TypeError from deep inside."""
    # bytes are ints read as ids of another text; a numpy scalar or 0-d array iterates
    # into a TypeError
    if isinstance(tokens, str | bytes | bytearray) or not hasattr(tokens, "__iter__") or \
            getattr(tokens, "ndim", 1) != 1:
        raise RequestError(f"token ids must be a sequence of integers, got "
                           f"{type(tokens).__name__}")
    return list(tokens)


def _step_loop(ref: weakref.ref[Engine], wake: threading.Event,
               warmed: threading.Event) -> None:
    """The background thread: warm up, then step until close() or until the engine is
    gone. It takes a strong reference only for one step at a time (Engine.__init__)."""
    engine = ref()
    assert engine is not None, "the engine starts its own thread"
    # The warm-up runs on the thread that will run every step: ONNX Runtime and the
    # kernels keep per-thread state (scratch, the pool's hand-off), and warmed on the
    # loading thread instead, 2 of 12 first requests still took 86-97 ms against ~50.
    try:
        if engine.config.warm_up:
            engine._warm_up()
    except BaseException as err:  # noqa: BLE001 - __init__ raises it on its own thread
        engine._warm_up_error = err
        return
    finally:
        warmed.set()
    del engine
    while (engine := ref()) is not None and not engine._stopping:
        wake.clear()
        busy = engine.step()
        del engine  # not held while idle
        if not busy:
            wake.wait(0.1)


def _warn_unclosed(bundle: str) -> None:
    warnings.warn(f"an Engine of {bundle} was never closed: call close() or use it in a "
                  "with block (its streams then end with 'cancelled')", ResourceWarning,
                  stacklevel=1)


def _slot(request: Request) -> int:
    assert request.slot is not None, "a request whose prompt is in the cache holds a slot"
    return request.slot
