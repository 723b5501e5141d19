"""The mixed workload of DESIGN.md section 6, run once per scheduling configuration.

    1. N interactive sessions start and decode (one token per decode step each);
    2. once all of them are decoding, a long prompt arrives (priority 0);
    3. as soon as its prefill starts, a short urgent request arrives (priority -1, "high",
       by default; lower is served first);
    4. when both have replied, the sessions decode a few more tokens and stop.

Under `fcfs` the long prompt is one engine call that every session waits behind; the
chunked policies split it, with decode steps of the sessions between the chunks.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from edgeprefill.bench.memory import PeakRSS
from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk.config import StepTrace
from edgeprefill.sdk.engine import Engine
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.sdk.stream import TokenStream

# Policy names of the sweep; "adaptive" is chunked+priority with the adaptive chunk size.
SWEEP_POLICIES = ("fcfs", "chunked", "chunked+priority", "adaptive")
STALL_TIMEOUT_S = 600.0  # a run that makes no progress for this long is a bug, not slowness
# Polling the streams' counters: often enough to react within a decode step of a real
# model, rarely enough not to steal the GIL from the engine thread on a small device.
POLL_S = 0.002


@dataclass(frozen=True)
class Workload:
    sessions: int = 3  # interactive sessions decoding throughout
    session_prompt_tokens: int = 32
    prompt_tokens: int = 1024  # the long prompt
    urgent: bool = True  # a short request arrives during the long prefill
    urgent_priority: int = -1  # lower is served first; the long prompt has 0
    urgent_prompt_tokens: int = 16
    reply_tokens: int = 8  # tokens the long and the urgent request generate
    tail_tokens: int = 8  # session tokens after both replies, before the sessions stop
    # Engine options (EngineConfig fields), the same as `run` and `serve` take.
    backend: str = "onnxruntime"
    device: str = "cpu"
    threads: int | None = None
    spin: bool | None = None  # compute threads busy-wait within a step (EngineConfig.spin)
    compute: str = "fp32"  # "bf16": projections and prefill attention in bf16 (BackendOptions)
    max_context: int | None = None  # positions per KV slot; None: the bundle's
    itl_target_ms: float = 150.0  # the adaptive chunk controller's target
    fuse_steps: bool | None = None  # one call for a chunk and the decode rows (SchedulerConfig)
    # prompts' chunks per fused step in the chunked runs (SchedulerConfig; fcfs refuses it)
    prefill_rows: int | None = None
    seed: int = 0  # of the random prompt token ids


@dataclass(frozen=True)
class RunSpec:
    policy: str  # one of SWEEP_POLICIES
    chunk_size: int | None = None  # fixed chunk for chunked policies; None otherwise

    @property
    def label(self) -> str:
        fixed = self.policy in ("chunked", "chunked+priority")
        return f"{self.policy}/{self.chunk_size}" if fixed else self.policy

    def engine_options(self) -> dict:
        if self.policy == "adaptive":
            return {"policy": "chunked+priority", "chunk_size": None}
        return {"policy": self.policy, "chunk_size": self.chunk_size}


@dataclass(frozen=True)
class Timeline:
    """What the picture needs: engine calls and request marks, seconds from the start."""

    steps: list[StepTrace]
    lanes: dict[int, str]  # request id -> lane name, top to bottom
    arrivals: dict[str, float]  # lane -> arrival (long prompt, urgent)
    first_tokens: dict[str, float]  # lane -> first token


@dataclass(frozen=True)
class RunResult:
    label: str
    policy: str
    chunk_size: int | None
    long_ttft_s: float
    urgent_ttft_s: float | None
    itl_p50_s: float
    itl_p99_s: float
    itl_max_s: float
    max_stall_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    peak_rss_bytes: int | None
    long_chunks: int
    wall_s: float
    timeline: Timeline = field(repr=False)


def sweep_specs(policies: list[str], chunk_sizes: list[int]) -> list[RunSpec]:
    """fcfs and adaptive run once; fixed-chunk policies once per chunk size."""
    specs: list[RunSpec] = []
    for policy in policies:
        if policy in ("fcfs", "adaptive"):
            specs.append(RunSpec(policy))
        else:
            specs.extend(RunSpec(policy, size) for size in chunk_sizes)
    return specs


def run_isolated(bundle: Path, spec: RunSpec, workload: Workload) -> RunResult:
    """`run_mixed` in a fresh Python process, so each run's peak memory is its own and not
    the heap that earlier runs left behind (allocators rarely hand memory back)."""
    context = multiprocessing.get_context("spawn")  # fork would copy this process's heap
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(run_mixed, bundle, spec, workload).result()


def run_mixed(bundle: Path, spec: RunSpec, workload: Workload) -> RunResult:
    """Load a fresh engine for `spec`, warm it up, run the workload once, measure."""
    w = workload
    engine = Engine.load(
        bundle, backend=w.backend, device=w.device, threads=w.threads, spin=w.spin,
        compute=w.compute,
        max_context=w.max_context, kv_slots=w.sessions + 2, trace=True,
        prefix_reuse=False,  # every run computes the long prompt in full
        itl_target_ms=w.itl_target_ms, fuse_steps=w.fuse_steps,
        prefill_rows=None if spec.policy == "fcfs" else w.prefill_rows, **spec.engine_options(),
    )
    try:
        check_fits(engine.capacity, w)
        _warm_up(engine, w)
        engine.trace.clear()
        with PeakRSS() as rss:
            started = time.perf_counter()
            streams = _drive(engine, w)
            wall = time.perf_counter() - started
        return _result(spec, engine.trace, streams, started, wall, rss.peak_bytes)
    finally:
        engine.close()


def check_fits(context: int, w: Workload) -> None:
    longest = max(w.prompt_tokens, w.session_prompt_tokens + w.tail_tokens) + w.reply_tokens
    if longest > context:
        most = context - w.reply_tokens
        raise EdgeprefillError(
            f"the long prompt ({w.prompt_tokens} tokens) + its reply ({w.reply_tokens}) "
            f"exceeds the bundle's context of {context} tokens; use --prompt-tokens {most} "
            "or less"
        )


# -- one run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Streams:
    sessions: list[TokenStream]
    long: TokenStream
    urgent: TokenStream | None


def _warm_up(engine: Engine, w: Workload) -> None:
    """The first call of each shape allocates buffers (fcfs: one call as long as the whole
    prompt); run the same shapes once so that cost stays out of the measurement."""
    ids = _prompt_ids(engine, w.seed + 1)
    params = GenerationParams(max_new_tokens=2, ignore_eos=True)
    streams = [engine.generate(ids(w.prompt_tokens), params)]
    streams += [engine.generate(ids(w.session_prompt_tokens), params) for _ in range(w.sessions)]
    for stream in streams:
        stream.result()


def _drive(engine: Engine, w: Workload) -> _Streams:
    ids = _prompt_ids(engine, w.seed)
    reply = GenerationParams(max_new_tokens=w.reply_tokens, ignore_eos=True)
    # Sessions may decode until the context is full; they are cancelled at the end.
    chat = GenerationParams(max_new_tokens=engine.capacity - w.session_prompt_tokens,
                            ignore_eos=True)
    sessions = [engine.generate(ids(w.session_prompt_tokens), chat) for _ in range(w.sessions)]
    _wait(lambda: all(len(s.metrics.token_times) >= 2 for s in sessions))
    long = engine.generate(ids(w.prompt_tokens), reply, priority=0)
    urgent = None
    if w.urgent:
        _wait(lambda: long.metrics.scheduled is not None or long.metrics.token_times)
        urgent = engine.generate(ids(w.urgent_prompt_tokens), reply, priority=w.urgent_priority)
        urgent.result()
    long.result()
    marks = [len(s.metrics.token_times) + w.tail_tokens for s in sessions]
    _wait(lambda: all(len(s.metrics.token_times) >= m or s.metrics.finish_reason
                      for s, m in zip(sessions, marks, strict=True)))
    for stream in sessions:
        stream.cancel()
    for stream in sessions:
        stream.result()  # wait for the cancellation: the trace is complete after this
    return _Streams(sessions, long, urgent)


def _prompt_ids(engine: Engine, seed: int) -> Callable[[int], list[int]]:
    """Random token ids: any bundle works, tokenizer or not, and no prefix is shared."""
    rng = np.random.default_rng(seed)
    vocab = engine.tokenizer.vocab_size
    return lambda n: rng.integers(0, vocab, size=n).tolist()


def _wait(done: Callable[[], object]) -> None:
    deadline = time.monotonic() + STALL_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise EdgeprefillError("the benchmark made no progress for 10 minutes")
        time.sleep(POLL_S)


# -- measurements -------------------------------------------------------------------------


def _result(
    spec: RunSpec, trace: list[StepTrace], s: _Streams, started: float, wall: float,
    peak_rss: int | None,
) -> RunResult:
    window = s.long.metrics.arrival  # interactive latency counts from the long prompt on
    gaps = _session_gaps(s.sessions, window)
    return RunResult(
        label=spec.label, policy=spec.policy, chunk_size=spec.chunk_size,
        long_ttft_s=_ttft(s.long),
        urgent_ttft_s=None if s.urgent is None else _ttft(s.urgent),
        itl_p50_s=float(np.percentile(gaps, 50)),
        itl_p99_s=float(np.percentile(gaps, 99)),
        itl_max_s=float(gaps.max()),
        max_stall_s=_max_stall(trace, window),
        prefill_tokens_per_s=_throughput(trace, "prefill"),
        decode_tokens_per_s=_throughput(trace, "decode"),
        peak_rss_bytes=peak_rss, long_chunks=s.long.metrics.chunks, wall_s=wall,
        timeline=_timeline(trace, s, started),
    )


def _ttft(stream: TokenStream) -> float:
    ttft = stream.metrics.ttft
    if ttft is None:
        raise EdgeprefillError(f"a benchmark request produced no token ({stream.error})")
    return ttft


def _session_gaps(sessions: list[TokenStream], since: float) -> np.ndarray:
    gaps = [
        later - earlier
        for stream in sessions
        for earlier, later in pairwise(stream.metrics.token_times)
        if later >= since
    ]
    if not gaps:
        raise EdgeprefillError("the sessions produced no token while the long prompt ran")
    return np.asarray(gaps)


def longest_decode_gap(trace: list[StepTrace],
                       since: float) -> tuple[StepTrace, StepTrace] | None:
    """The two consecutive decode calls with the longest gap between their ends, the later
    ending at `since` or after (the sessions decode throughout): the table's max stall,
    and the stall the plot marks."""
    decodes = [t for t in trace if t.kind == "decode"]
    pairs = [(a, b) for a, b in pairwise(decodes) if b.end >= since]
    return max(pairs, key=lambda pair: pair[1].end - pair[0].end, default=None)


def _max_stall(trace: list[StepTrace], since: float) -> float:
    pair = longest_decode_gap(trace, since)
    return 0.0 if pair is None else pair[1].end - pair[0].end


def _throughput(trace: list[StepTrace], kind: str) -> float:
    steps = [t for t in trace if t.kind == kind]
    seconds = sum(t.end - t.start for t in steps)
    return sum(t.tokens for t in steps) / seconds if seconds else 0.0


def _timeline(trace: list[StepTrace], s: _Streams, started: float) -> Timeline:
    lanes = {stream.request_id: f"session {i + 1}" for i, stream in enumerate(s.sessions)}
    named = [("long prompt", s.long)] + ([("urgent", s.urgent)] if s.urgent else [])
    lanes.update({stream.request_id: name for name, stream in named})
    steps = [t._replace(start=t.start - started, end=t.end - started) for t in trace]
    return Timeline(
        steps=steps, lanes=lanes,
        arrivals={name: st.metrics.arrival - started for name, st in named},
        first_tokens={name: st.metrics.token_times[0] - started for name, st in named},
    )
