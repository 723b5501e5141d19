"""What the runtime measures: per request and per engine, as typed snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestMetrics:
    """Times are time.perf_counter() seconds; derived values are properties."""

    arrival: float
    scheduled: float | None = None  # first prefill chunk started
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    prefix_reused: int = 0  # prompt tokens whose KV was reused instead of computed
    chunks: int = 0
    finish_reason: str | None = None
    # The last sampled token was an EOS: timed (token_times), not part of the output.
    ended_on_eos: bool = False

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def inter_token_latencies(self) -> list[float]:
        """Gaps between the output's tokens: a final EOS reaches no one."""
        times = self.token_times[:self.generated_tokens]
        return list(np.diff(times)) if len(times) > 1 else []

    @property
    def generated_tokens(self) -> int:
        """The output's tokens (TokenStream.token_ids): a final EOS is sampled and timed,
        never output."""
        return len(self.token_times) - self.ended_on_eos

    def itl_percentile(self, q: float) -> float | None:
        itl = self.inter_token_latencies
        return float(np.percentile(itl, q)) if itl else None

    def summary(self) -> dict[str, float | int | str | None]:
        itl = self.inter_token_latencies
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "queue_s": self.queue_time,
            "ttft_s": self.ttft,
            "itl_p50_s": self.itl_percentile(50),
            "itl_p99_s": self.itl_percentile(99),
            "itl_max_s": float(max(itl)) if itl else None,
            "chunks": self.chunks,
            "prefix_reused": self.prefix_reused,
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True)
class EngineMetrics:
    prefill_tokens: int
    prefill_seconds: float
    decode_tokens: int
    decode_seconds: float
    decode_steps: int
    max_decode_stall_s: float  # longest gap between two decode steps while sessions waited
    kv_slots: int
    kv_active: int
    kv_retained: int
    kv_tokens: int
    kv_bytes: int
    prefix_lookups: int
    prefix_hits: int
    queue_depth: int
    running: int
    finished: int
    # Decode steps that ran a prefill chunk in the same call (Scheduler: fused). Their time
    # counts in decode_seconds and prefill_seconds both.
    fused_steps: int = 0
    # Calls that prefilled, and the prompts' chunks they carried (more than one a call where
    # prompts share a step: scheduler.py, shared prefill).
    prefill_steps: int = 0
    prefill_rows: int = 0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0


@dataclass
class EngineCounters:
    """Mutable accumulators owned by the step loop; `snapshot` freezes them."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    fused_steps: int = 0
    prefill_steps: int = 0
    prefill_rows: int = 0
    max_decode_stall_s: float = 0.0
    finished: int = 0
    last_decode_end: float | None = None
