"""Prometheus metrics: the engine's runtime counters, read at scrape time, plus
per-request histograms of time to first token and inter-token latency."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgeprefill.sdk.engine import Engine
from edgeprefill.sdk.stream import TokenStream

# 1 ms .. 30 s: decode steps on a small device are milliseconds, a long prefill seconds.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class EngineMetric(NamedTuple):
    name: str  # Prometheus name, without the `edgeprefill_` prefix
    field: str  # attribute of EngineMetrics
    counter: bool  # monotonic (a counter) or a gauge
    help: str


ENGINE_METRICS = (
    EngineMetric("prefill_tokens", "prefill_tokens", True, "Prompt tokens prefilled"),
    EngineMetric("prefill_seconds", "prefill_seconds", True,
                 "Seconds spent in prefill calls (a fused call counts here and in decode's)"),
    EngineMetric("decode_tokens", "decode_tokens", True,
                 "Tokens sampled by decode calls (a final EOS included; a reply's first "
                 "token comes from its prefill)"),
    EngineMetric("decode_seconds", "decode_seconds", True,
                 "Seconds spent in decode calls (a fused call counts here and in prefill's)"),
    EngineMetric("decode_steps", "decode_steps", True, "Batched decode calls"),
    EngineMetric("fused_steps", "fused_steps", True,
                 "Decode calls that ran a prefill chunk in the same call"),
    EngineMetric("prefill_steps", "prefill_steps", True,
                 "Calls that prefilled (a fused call counts here and in decode's)"),
    EngineMetric("prefill_rows", "prefill_rows", True,
                 "Prompts' prefill chunks run (more than one a call where prompts share a "
                 "step)"),
    EngineMetric("prefix_lookups", "prefix_lookups", True, "KV prefix-cache lookups"),
    EngineMetric("prefix_hits", "prefix_hits", True, "KV prefix-cache lookups that reused KV"),
    EngineMetric("requests_finished", "finished", True, "Requests finished, any reason"),
    EngineMetric("max_decode_stall_seconds", "max_decode_stall_s", False,
                 "Longest gap between two decode steps while sessions waited"),
    EngineMetric("kv_slots", "kv_slots", False, "KV cache slots"),
    EngineMetric("kv_slots_active", "kv_active", False, "KV slots held by live requests"),
    EngineMetric("kv_slots_retained", "kv_retained", False, "KV slots kept for prefix reuse"),
    EngineMetric("kv_tokens", "kv_tokens", False, "Positions holding valid KV, all slots"),
    EngineMetric("kv_bytes", "kv_bytes", False, "Bytes of KV cache memory"),
    EngineMetric("queue_depth", "queue_depth", False, "Requests waiting for a KV slot"),
    EngineMetric("requests_running", "running", False, "Requests prefilling or decoding"),
    EngineMetric("prefill_tokens_per_second", "prefill_tokens_per_s", False,
                 "Prefill throughput since start"),
    EngineMetric("decode_tokens_per_second", "decode_tokens_per_s", False,
                 "Decode throughput since start"),
    EngineMetric("prefix_hit_rate", "prefix_hit_rate", False, "Prefix-cache hits / lookups"),
)


class EngineCollector(Collector):
    """Reads `engine.metrics()` on every scrape, so the numbers are never stale."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        snapshot = self.engine.metrics()
        for m in ENGINE_METRICS:
            family = CounterMetricFamily if m.counter else GaugeMetricFamily
            yield family(f"edgeprefill_{m.name}", m.help, value=getattr(snapshot, m.field))


class ServerMetrics:
    """One registry per app (not the process-global one), so two servers in one process,
    as in the tests, never clash."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Engine) -> None:
        self.registry = registry = CollectorRegistry()
        registry.register(EngineCollector(engine))
        self.ttft = Histogram(
            "edgeprefill_request_ttft_seconds", "Time from arrival to the first token",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.itl = Histogram(
            "edgeprefill_request_inter_token_latency_seconds",
            "Gap between two tokens of a reply (every choice's)",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.requests = Counter(
            "edgeprefill_http_requests", "Completion requests by endpoint and finish reason",
            ["endpoint", "finish_reason"], registry=registry,
        )
        self.rejected = Counter(
            "edgeprefill_http_rejected", "Requests refused with an error status",
            ["status"], registry=registry,
        )

    def observe(self, endpoint: str, stream: TokenStream, cancelled: bool = False) -> None:
        """Record a closed request. One the client left before it ended: cancelled."""
        metrics = stream.metrics
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        for choice in getattr(stream, "streams", (stream,)):  # each of n choices
            for gap in choice.metrics.inter_token_latencies:
                self.itl.observe(gap)
        reason = "cancelled" if cancelled else stream.finish_reason or "cancelled"
        self.requests.labels(endpoint=endpoint, finish_reason=reason).inc()

    def reject(self, status: int) -> None:
        self.rejected.labels(status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
